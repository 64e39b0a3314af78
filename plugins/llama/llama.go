package llama

import (
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
)

// plugin is Llama: the common decoder with optional attention and MLP
// biases (tied embeddings, GQA, head_dim and rope are common config).
var plugin = decoder.Plugin{Name: "llama", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "llama", HFArchitectures: []string{"LlamaForCausalLM"}, Name: "Llama", Load: load,
	Targets: []string{sdk.TargetORT},
	// LlamaConfig's other defaults are the common decoder's.
	Defaults: map[string]any{"max_position_embeddings": 2048},
}}}

func load(m *decoder.Model) error {
	decoder.RequireSiLU(m.Reader, "llama")
	attentionBias, mlpBias := m.BoolOr("attention_bias", false), m.BoolOr("mlp_bias", false)
	m.Kind("decoder", "LlamaDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(&decoder.Attention{QKVBias: attentionBias, OBias: attentionBias},
			&decoder.SwiGLU{Width: m.Intermediate, Bias: mlpBias})
	})
	return nil
}
