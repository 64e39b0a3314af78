package glm

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const (
	kindMoE   = "moe"
	kindDense = "dense"
	optMTP    = decoder.MTPOptionName
	mtpSkip   = decoder.MTPSkip
	mtpDraft  = decoder.MTPDraft
	modelMTP  = decoder.ModelMTP
)

// plugin is GLM-4.x MoE: the common decoder with q/k/v biases, optional
// q/k norms, partial RoPE, the first first_k_dense_replace layers dense and
// the rest MoE (sigmoid router with correction bias and groups, scaled
// weights, shared experts), and an MTP layer after the last decoder layer.
var plugin = decoder.Plugin{Name: "glm", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "glm4_moe", HFArchitectures: []string{"Glm4MoeForCausalLM"}, Name: "Glm4Moe",
	Capabilities: &pb.Capabilities{Layerwise: true, ExpertLayouts: []string{"per-expert", "fused"},
		MtpConventions: []string{mtpInlined, mtpIndexed, mtpSeparateFile}, Models: []string{modelMTP}},
	Options: []*pb.PluginOption{
		decoder.MoEStrategyOption(),
		decoder.MTPOption(),
	},
	// Glm4MoeConfig's: partial rotary (it sets 0.5 when config.json has
	// none, top-level or in rope_parameters), 8 KV heads, rms_norm_eps 1e-5.
	Defaults: map[string]any{"partial_rotary_factor": 0.5, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
		"max_position_embeddings": 131072},
	Load: load,
}}}

// config holds the glm4_moe fields beyond the common ones.
type config struct {
	experts, topK, moeIntermediate, shared, firstDense int
	groups, topKGroups                                 int
	normTopK, qkNorm, bias                             bool
	scale                                              float64
	stored                                             *decoder.StoredExperts // per-expert or fused, per MoE layer (MTP layers too)
}

func load(m *decoder.Model) error {
	c := config{
		experts: m.FirstInt("n_routed_experts", "num_local_experts"), topK: m.Int("num_experts_per_tok"),
		moeIntermediate: m.Int("moe_intermediate_size"), shared: m.IntOr("n_shared_experts", 1),
		firstDense: m.IntOr("first_k_dense_replace", 1), groups: m.IntOr("n_group", 1), topKGroups: m.IntOr("topk_group", 1),
		normTopK: m.BoolOr("norm_topk_prob", true), qkNorm: m.BoolOr("use_qk_norm", false),
		bias: m.BoolOr("attention_bias", false), scale: m.FloatOr("routed_scaling_factor", 1),
	}
	decoder.RequireSiLU(m.Reader, "glm")
	if m.Err != nil {
		return m.Err
	}
	switch {
	case c.experts < 1:
		return fmt.Errorf("config.json: n_routed_experts must be positive, got %d", c.experts)
	case c.topK < 1 || c.topK > c.experts:
		return fmt.Errorf("config.json: num_experts_per_tok %d must be in 1..n_routed_experts (%d)", c.topK, c.experts)
	case c.moeIntermediate <= 0:
		return fmt.Errorf("config.json: moe_intermediate_size must be positive, got %d", c.moeIntermediate)
	case c.shared < 0:
		return fmt.Errorf("config.json: n_shared_experts must be ≥ 0, got %d", c.shared)
	case c.firstDense < 0:
		return fmt.Errorf("config.json: first_k_dense_replace must be ≥ 0, got %d", c.firstDense)
	case c.groups < 1 || c.experts%c.groups != 0:
		return fmt.Errorf("config.json: n_group %d must divide n_routed_experts (%d)", c.groups, c.experts)
	case c.topKGroups < 1 || c.topKGroups > c.groups:
		return fmt.Errorf("config.json: topk_group %d must be in 1..n_group (%d)", c.topKGroups, c.groups)
	case c.experts/c.groups < 2:
		return fmt.Errorf("config.json: n_group %d leaves %d expert per group; a group's score is the sum of its best two", c.groups, c.experts/c.groups)
	case c.topK > c.topKGroups*(c.experts/c.groups):
		return fmt.Errorf("config.json: num_experts_per_tok %d exceeds the experts of the topk_group %d groups kept (%d)",
			c.topK, c.topKGroups, c.topKGroups*(c.experts/c.groups))
	case !(c.scale > 0):
		return fmt.Errorf("config.json: routed_scaling_factor must be > 0, got %g", c.scale)
	}
	mtp, err := detectMTP(m)
	if err != nil {
		return err
	}
	m.KindOf = c.kind
	c.stored = &decoder.StoredExperts{Count: c.experts, CountField: "n_routed_experts", Intermediate: c.moeIntermediate}
	detect := func(i int32) error { return c.stored.Detect(m, i) }
	if err := m.EveryLayer(detect, kindMoE); err != nil {
		return err
	}
	if mtp.draft {
		for _, i := range mtp.layout.GetLayers() {
			if err := detect(i); err != nil {
				return fmt.Errorf("MTP layer: %w", err)
			}
		}
	}
	attention := func() *decoder.Attention { return &decoder.Attention{QKVBias: c.bias, QKNorm: c.qkNorm} }
	m.Kind(kindMoE, "Glm4MoeDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(attention(), &moe{config: c, strategy: m.Options[decoder.MoEStrategy]})
	})
	m.Kind(kindDense, "Glm4MoeDenseDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(attention(), &decoder.SwiGLU{Width: m.Intermediate})
	})
	return mtp.declare(m, c)
}

// kind: layers below first_k_dense_replace are dense, the rest MoE, as
// Glm4MoeDecoderLayer decides.
func (c config) kind(i int) string {
	if i < c.firstDense {
		return kindDense
	}
	return kindMoE
}

// moe is Glm4MoeMoE: the sigmoid router, the routed experts run by
// strategy, plus the shared experts (unweighted).
type moe struct {
	config
	strategy string
	router   blocks.Router
	run      blocks.Experts
	shared   *decoder.SwiGLU
}

func (b *moe) Declare(l *decoder.Layer) {
	e, h := int64(b.config.experts), int64(l.Model.Hidden)
	b.router = blocks.Router{Kind: blocks.SigmoidGrouped, Experts: b.config.experts, TopK: b.topK, Normalize: b.normTopK,
		Weight: l.Weight("mlp.gate.weight", e, h), CorrectionBias: l.Weight("mlp.gate.e_score_correction_bias", e),
		Groups: b.groups, TopKGroups: b.topKGroups, Scale: b.scale}
	b.run.Gate, b.run.Up, b.run.Down = b.stored.Declare(l)
	if b.config.shared > 0 {
		b.shared = &decoder.SwiGLU{Name: "mlp.shared_experts", Width: b.moeIntermediate * b.config.shared}
		b.shared.Declare(l)
	}
}

func (b *moe) Apply(l *decoder.Layer, f *fn.Func, x fn.Value) (fn.Value, error) {
	out, err := decoder.RoutedExperts(f, x, l.Model.Hidden, b.router, "gate", b.run, b.strategy)
	if err != nil {
		return "", err
	}
	if b.shared == nil {
		return out, nil
	}
	s, err := b.shared.Apply(l, f.Scope("shared_experts"), x)
	if err != nil {
		return "", err
	}
	return f.Add(out, s), nil
}
