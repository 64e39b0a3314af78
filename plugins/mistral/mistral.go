// Package mistral exports Mistral checkpoints (model_type
// mistral, MistralForCausalLM) as transformers' modeling_mistral.py
// computes them: Llama's decoder without biases, every layer attending to
// the last sliding_window positions unless sliding_window is null.
package mistral

import (
	"fmt"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
)

// Plugin is the mistral plugin; cmd/strata-plugin-mistral serves it.
func Plugin() sdk.Architecture { return plugin }

var plugin = decoder.Plugin{Name: "mistral", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "mistral", HFArchitectures: []string{"MistralForCausalLM"}, Name: "Mistral", Load: load,
	Targets: []string{sdk.TargetORT},
	// MistralConfig's: null num_key_value_heads is still the heads, null
	// sliding_window full attention.
	Defaults: map[string]any{"num_key_value_heads": 8, "sliding_window": 4096, "max_position_embeddings": 4096 * 32},
}}}

// load refuses what Mistral's math does not have and declares one
// layer kind: pre-norm attention (no biases, masked to the window when there
// is one) and a SwiGLU MLP.
func load(m *decoder.Model) error {
	decoder.RequireSiLU(m.Reader, "mistral")
	if err := refuse(m); err != nil {
		return err
	}
	window, err := slidingWindow(m)
	if err != nil {
		return err
	}
	mask := ""
	if window > 0 {
		if mask, err = decoder.EverySliding(m, window); err != nil {
			return err
		}
	}
	m.Kind("decoder", "MistralDecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(&decoder.Attention{Mask: mask}, &decoder.SwiGLU{Width: m.Intermediate})
	})
	return nil
}

// slidingWindow is the window every layer attends to, 0 for full
// attention: sliding_window (MistralConfig's default when absent), none
// when null.
func slidingWindow(m *decoder.Model) (int, error) {
	if !m.Config.Has("sliding_window") {
		return 0, nil
	}
	window := m.Int("sliding_window")
	if m.Defaulted("sliding_window") {
		m.Note("sliding_window is absent: MistralConfig's default %d applies", window)
	}
	if m.Err == nil && window < 1 {
		return 0, fmt.Errorf("config.json: sliding_window must be positive (or null for full attention), got %d", window)
	}
	return window, m.Err
}

// refuse refuses fields that would change the math: a partial rotary
// factor (Mistral rotates the whole head), per-layer overrides, and layer
// types that differ (transformers' MistralModel slides every layer alike).
func refuse(m *decoder.Model) error {
	if m.RoPE.Dim != m.HeadDim {
		return fmt.Errorf("config.json: partial_rotary_factor (rotary dimension %d of head_dim %d) is not supported by the mistral plugin: transformers' Mistral rotates the whole head (its default rope ignores the factor, scaled ropes fail on it)", m.RoPE.Dim, m.HeadDim)
	}
	if m.Config.Has("per_layer_config") {
		return fmt.Errorf("config.json: per_layer_config (per-layer overrides) is not supported by the mistral plugin")
	}
	types := m.Strings("layer_types")
	for i, t := range types {
		switch {
		case t != "sliding_attention" && t != "full_attention":
			return fmt.Errorf("config.json: layer_types[%d] is %q; Mistral layers are sliding_attention or full_attention", i, t)
		case t != types[0]:
			return fmt.Errorf("config.json: layer_types mixes %q and %q: transformers' MistralModel applies sliding_window to every layer alike (alternating attention is Ministral's)", types[0], t)
		}
	}
	return m.Err
}
