package main

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const (
	kindMoE     = "moe"
	kindDense   = "dense"
	optStrategy = "moe_strategy"
)

// plugin is Qwen3-MoE: the common decoder with q/k norms, sparse MoE
// layers (softmax router, top-k, optional renormalisation) and dense ones
// where decoder_sparse_step and mlp_only_layers say.
var plugin = decoder.Plugin{Name: "qwen3moe", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "qwen3_moe", HFArchitectures: []string{"Qwen3MoeForCausalLM"}, Name: "Qwen3Moe",
	Capabilities: &pb.Capabilities{Layerwise: true, ExpertLayouts: []string{"per-expert", "fused"}},
	Options: []*pb.PluginOption{{Name: optStrategy, DefaultValue: blocks.Gather, AllowedValues: blocks.ExpertStrategies,
		Help: "gather: each token's k experts (decode-friendly); dense: every expert, weighed (static matmuls)"}},
	Load: load,
}}}

// config holds the MoE fields of a Qwen3-MoE config.json.
type config struct {
	experts, topK, moeIntermediate, sparseStep int
	mlpOnly                                    []int
	normTopK                                   bool
	stored                                     *decoder.StoredExperts // per-expert or fused, per MoE layer
}

func load(m *decoder.Model) error {
	c := config{
		experts: m.FirstInt("num_experts", "num_local_experts"), topK: m.Int("num_experts_per_tok"),
		moeIntermediate: m.Int("moe_intermediate_size"), sparseStep: m.IntOr("decoder_sparse_step", 1),
		mlpOnly: m.Ints("mlp_only_layers"), normTopK: m.BoolOr("norm_topk_prob", false),
	}
	decoder.RequireSiLU(m.Reader, "qwen3moe")
	sliding := m.BoolOr("use_sliding_window", false)
	if m.Err != nil {
		return m.Err
	}
	switch {
	case sliding:
		return fmt.Errorf("config.json: use_sliding_window is true; the qwen3moe plugin exports full attention only")
	case c.experts > 0 && (c.topK < 1 || c.topK > c.experts):
		return fmt.Errorf("config.json: num_experts_per_tok %d must be in 1..num_experts (%d)", c.topK, c.experts)
	case c.sparseStep < 1:
		return fmt.Errorf("config.json: decoder_sparse_step must be at least 1, got %d", c.sparseStep)
	case c.moeIntermediate <= 0:
		return fmt.Errorf("config.json: moe_intermediate_size must be positive, got %d", c.moeIntermediate)
	}
	m.KindOf = c.kind
	c.stored = &decoder.StoredExperts{Count: c.experts, CountField: "num_experts", Intermediate: c.moeIntermediate}
	if err := m.EveryLayer(func(i int32) error { return c.stored.Detect(m, i) }, kindMoE); err != nil {
		return err
	}
	attention := func() *decoder.Attention { return &decoder.Attention{QKNorm: true} }
	m.Kind(kindMoE, "Qwen3MoeDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(attention(), &moe{config: c, strategy: m.Options[optStrategy]})
	})
	m.Kind(kindDense, "Qwen3MoeDenseDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(attention(), &decoder.SwiGLU{Width: m.Intermediate})
	})
	return nil
}

// kind says whether layer i is a sparse MoE layer, as transformers decides.
func (c config) kind(i int) string {
	if !slices.Contains(c.mlpOnly, i) && c.experts > 0 && (i+1)%c.sparseStep == 0 {
		return kindMoE
	}
	return kindDense
}

// moe is the sparse MLP: a softmax router over the experts, then the
// chosen experts run by strategy.
type moe struct {
	config
	strategy string
	router   blocks.Router
	run      blocks.Experts
}

func (b *moe) Declare(l *decoder.Layer) {
	b.router = blocks.Router{Kind: blocks.SoftmaxTopK, Experts: b.config.experts, TopK: b.topK, Normalize: b.normTopK,
		Weight: l.Weight("mlp.gate.weight", int64(b.config.experts), int64(l.Model.Hidden))}
	b.run.Gate, b.run.Up, b.run.Down = b.stored.Declare(l)
}

func (b *moe) Apply(l *decoder.Layer, f *fn.Func, x fn.Value) (fn.Value, error) {
	return decoder.RoutedExperts(f, x, l.Model.Hidden, b.router, "router", b.run, b.strategy)
}
