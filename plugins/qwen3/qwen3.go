// Package qwen3 exports Qwen3 dense checkpoints (model_type
// qwen3). It is the walk-through of docs/plugins.md: a new architecture is
// what differs from the common decoder, here q/k norms.
package qwen3

import (
	"fmt"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
)

// Plugin is the qwen3 plugin; cmd/strata-plugin-qwen3 serves it.
func Plugin() sdk.Architecture { return plugin }

var plugin = decoder.Plugin{Name: "qwen3", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "qwen3", HFArchitectures: []string{"Qwen3ForCausalLM"}, Name: "Qwen3", Load: load,
	Targets: []string{sdk.TargetORT},
	// Qwen3Config's, where they differ from the common decoder's: KV heads
	// and head_dim fixed, not derived from the heads.
	Defaults: map[string]any{"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768},
}}}

// load reads what Qwen3 adds to the common config and declares its one
// layer kind: pre-norm attention with per-head q/k RMSNorm, and a SwiGLU MLP.
func load(m *decoder.Model) error {
	decoder.RequireSiLU(m.Reader, "qwen3")
	bias := m.BoolOr("attention_bias", false)
	if m.BoolOr("use_sliding_window", false) {
		return fmt.Errorf("config.json: use_sliding_window is true; the qwen3 plugin exports full attention only")
	}
	m.Kind("decoder", "Qwen3DecoderLayer", func(l *decoder.Layer) error {
		attention := &decoder.Attention{QKVBias: bias, OBias: bias, QKNorm: true}
		return l.PreNorm(attention, &decoder.SwiGLU{Width: m.Intermediate})
	})
	return nil
}
