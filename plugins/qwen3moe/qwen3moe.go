package qwen3moe

import (
	"fmt"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const (
	kindMoE   = "moe"
	kindDense = "dense"
)

// plugin is Qwen3-MoE: the common decoder with q/k norms, sparse MoE
// layers (softmax router, top-k, optional renormalisation) and dense ones
// where decoder_sparse_step and mlp_only_layers say.
var plugin = decoder.Plugin{Name: "qwen3moe", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "qwen3_moe", HFArchitectures: []string{"Qwen3MoeForCausalLM"}, Name: "Qwen3Moe",
	Capabilities: &pb.Capabilities{Layerwise: true, ExpertLayouts: []string{"per-expert", "fused"}},
	Options:      []*pb.PluginOption{decoder.FusedMoEStrategyOption()},
	Targets:      []string{sdk.TargetORT},                                                    // the experts as ONNX Runtime's MoE op, or the --moe-strategy form (decoder.qwenMoEBlock)
	Defaults:     map[string]any{"num_key_value_heads": 4, "max_position_embeddings": 32768}, // Qwen3MoeConfig's
	Load:         load,
}}}

func load(m *decoder.Model) error {
	c := decoder.ReadQwenMoE(m)
	c.Normalize = m.BoolOr("norm_topk_prob", false)
	decoder.RequireSiLU(m.Reader, "qwen3moe")
	sliding := m.BoolOr("use_sliding_window", false)
	if m.Err != nil {
		return m.Err
	}
	if sliding {
		return fmt.Errorf("config.json: use_sliding_window is true; the qwen3moe plugin exports full attention only")
	}
	if err := c.Check(m); err != nil {
		return err
	}
	m.KindOf = c.KindOf(kindMoE, kindDense)
	// the experts, per-expert or fused as each MoE layer's keys say
	stored := &decoder.StoredExperts{Count: c.Experts, CountField: "num_experts", Intermediate: c.Intermediate}
	if err := m.EveryLayer(func(i int32) error { return stored.Detect(m, i) }, kindMoE); err != nil {
		return err
	}
	attention := func() *decoder.Attention { return &decoder.Attention{QKNorm: true} }
	m.Kind(kindMoE, "Qwen3MoeDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(attention(), c.StoredBlock(m.Options[decoder.MoEStrategy], stored))
	})
	m.Kind(kindDense, "Qwen3MoeDenseDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(attention(), &decoder.SwiGLU{Width: m.Intermediate})
	})
	return nil
}
