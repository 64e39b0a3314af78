package glm

import (
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const (
	kindMoE   = "moe"
	kindDense = "dense"
)

// plugin is GLM-4.x MoE: the common decoder with q/k/v biases, optional
// q/k norms, partial RoPE, the first first_k_dense_replace layers dense and
// the rest MoE (decoder.GroupedMoE: sigmoid router with correction bias and
// groups, scaled weights, shared experts), and an MTP layer after the last
// decoder layer (decoder.NextN).
var plugin = decoder.Plugin{Name: "glm", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "glm4_moe", HFArchitectures: []string{"Glm4MoeForCausalLM"}, Name: "Glm4Moe",
	Targets: []string{sdk.TargetORT}, // the experts in the --moe-strategy form (decoder.groupedMoE)
	Capabilities: &pb.Capabilities{Layerwise: true, ExpertLayouts: []string{"per-expert", "fused"},
		MtpConventions: []string{decoder.MTPInlined, decoder.MTPIndexed, decoder.MTPSeparateFile}, Models: []string{decoder.ModelMTP}},
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

func load(m *decoder.Model) error {
	firstDense := m.IntOr("first_k_dense_replace", 1)
	qkNorm, bias := m.BoolOr("use_qk_norm", false), m.BoolOr("attention_bias", false)
	decoder.RequireSiLU(m.Reader, "glm")
	if m.Err != nil {
		return m.Err
	}
	c, err := decoder.ReadGroupedMoE(m)
	if err != nil {
		return err
	}
	kind, err := decoder.FirstDense(firstDense, kindDense, kindMoE)
	if err != nil {
		return err
	}
	mtp, err := decoder.DetectNextN(m)
	if err != nil {
		return err
	}
	m.KindOf = kind
	if err := c.Detect(m, kindMoE, mtp); err != nil {
		return err
	}
	attention := func() *decoder.Attention { return &decoder.Attention{QKVBias: bias, QKNorm: qkNorm} }
	m.Kind(kindMoE, "Glm4MoeDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(attention(), c.Block(m.Options[decoder.MoEStrategy]))
	})
	m.Kind(kindDense, "Glm4MoeDenseDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(attention(), &decoder.SwiGLU{Width: m.Intermediate})
	})
	return mtp.Declare(m, kind)
}
