// Package olmo2 exports OLMo-2 checkpoints (model_type olmo2,
// Olmo2ForCausalLM) as transformers' modeling_olmo2.py computes them:
// Llama's decoder with its norms after the sublayers instead of before
// (post_attention_layernorm on attention's output, post_feedforward_layernorm
// on the MLP's, no input_layernorm) and q/k RMSNorms over all heads at once.
package olmo2

import (
	"fmt"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
)

// Plugin is the olmo2 plugin; cmd/strata-plugin-olmo2 serves it.
func Plugin() sdk.Architecture { return plugin }

var plugin = decoder.Plugin{Name: "olmo2", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "olmo2", HFArchitectures: []string{"Olmo2ForCausalLM"}, Name: "Olmo2", Load: load,
	Targets:  []string{sdk.TargetORT},
	Defaults: map[string]any{"rms_norm_eps": 1e-5, "max_position_embeddings": 2048}, // Olmo2Config's
}}}

// load refuses what OLMo-2's math does not have and declares one layer
// kind: attention (q/k/v/o biases with attention_bias) and a SwiGLU MLP,
// each followed by its norm before the residual add.
func load(m *decoder.Model) error {
	decoder.RequireSiLU(m.Reader, "olmo2")
	if m.RoPE.Dim != m.HeadDim {
		return fmt.Errorf("config.json: partial_rotary_factor (rotary dimension %d of head_dim %d) is not supported by the olmo2 plugin: transformers' OLMo-2 rotates the whole head (its default rope ignores the factor)", m.RoPE.Dim, m.HeadDim)
	}
	bias := m.BoolOr("attention_bias", false)
	m.Kind("decoder", "Olmo2DecoderLayer", func(l *decoder.Layer) error {
		attention := &decoder.Attention{QKVBias: bias, OBias: bias, QKNorm: true, QKNormAllHeads: true}
		return l.Residual(attention, decoder.Norms{Post: "post_attention_layernorm"},
			&decoder.SwiGLU{Width: m.Intermediate}, decoder.Norms{Post: "post_feedforward_layernorm"})
	})
	return m.Err
}
