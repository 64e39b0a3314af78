// Package phi3 exports Phi-3 checkpoints (model_type phi3,
// Phi3ForCausalLM: Phi-3, Phi-3.5, Phi-4-mini) as transformers'
// modeling_phi3.py computes them: Llama's decoder without biases, with q, k
// and v stored as one self_attn.qkv_proj and the MLP's gate and up as one
// mlp.gate_up_proj (bound as row slices of the stored tensors), partial
// rotary, default or longrope RoPE, and sliding_window on every layer when
// it is set.
package phi3

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
)

// Plugin is the phi3 plugin; cmd/strata-plugin-phi3 serves it.
func Plugin() sdk.Architecture { return plugin }

var plugin = decoder.Plugin{Name: "phi3", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "phi3", HFArchitectures: []string{"Phi3ForCausalLM"}, Name: "Phi3", Load: load,
	Targets: []string{sdk.TargetORT},
	// Phi3Config's: original_max_position_embeddings is top-level, and
	// transformers gives it priority over the rope parameters' own.
	Defaults: map[string]any{"rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096},
}}}

// load refuses what Phi-3's math does not have and declares one
// layer kind: pre-norm attention over the fused qkv_proj (masked to the
// window when there is one) and a SwiGLU MLP over the fused gate_up_proj.
func load(m *decoder.Model) error {
	decoder.RequireSiLU(m.Reader, "phi3")
	if err := rope(m); err != nil {
		return err
	}
	mask := ""
	if m.Config.Has("sliding_window") { // null: full attention
		window := m.Int("sliding_window")
		if m.Err != nil {
			return m.Err
		}
		var err error
		if mask, err = decoder.EverySliding(m, window); err != nil {
			return err
		}
	}
	m.Kind("decoder", "Phi3DecoderLayer", func(l *decoder.Layer) error {
		return l.PreNorm(&decoder.Attention{FusedQKV: "self_attn.qkv_proj", Mask: mask},
			&decoder.SwiGLU{Width: m.Intermediate, FusedGateUp: "mlp.gate_up_proj"})
	})
	return m.Err
}

// rope refuses the rope settings where transformers' Phi3Config reads
// config.json otherwise than the common decoder: the types it rejects or
// renames, rope_scaling next to rope_parameters (Phi3Config prefers
// rope_scaling), and for longrope a head_dim other than hidden/heads (its
// factor-length check uses hidden/heads).
func rope(m *decoder.Model) error {
	r := m.RoPE
	if !slices.Contains([]string{"default", "longrope"}, r.Type) {
		return fmt.Errorf("config.json: rope type %q is not supported by the phi3 plugin: transformers' Phi3Config accepts default and longrope (and renames su and yarn to longrope)", r.Type)
	}
	if m.Config.Has("rope_scaling") && m.Config.Has("rope_parameters") {
		return fmt.Errorf("config.json: rope_scaling next to rope_parameters is not supported by the phi3 plugin (Phi3Config reads rope_scaling, the common decoder rope_parameters)")
	}
	if r.Type != "longrope" {
		return nil
	}
	if m.HeadDim != m.Hidden/m.Heads {
		return fmt.Errorf("config.json: head_dim %d ≠ hidden_size / num_attention_heads (%d) with longrope is not supported by the phi3 plugin (Phi3Config sizes the factors by hidden_size / num_attention_heads)", m.HeadDim, m.Hidden/m.Heads)
	}
	m.Note("longrope: short_factor while max(position_ids) + 1 ≤ %g, long_factor beyond, chosen per call over the whole batch as transformers' forward does; cached keys are not re-rotated: to match transformers' generate(), re-run the prefill without the cache when a sequence first passes %g tokens", r.OriginalMaxPositions, r.OriginalMaxPositions)
	return nil
}
