// Package gemma3 exports Gemma-3 text checkpoints (model_type
// gemma3_text, Gemma3ForCausalLM) as transformers' modeling_gemma3.py
// computes them: RMSNorms weighing by 1 + w in float32 before and after
// both sublayers and on the per-head queries and keys, a GeGLU MLP (tanh
// GELU), embeddings scaled by √hidden_size, attention scaled by
// query_pre_attn_scalar^-½, layer_types' sliding_attention layers
// masked to sliding_window and turning at the local RoPE base while the
// full_attention layers turn at rope_theta (with its scaling), and the
// logits soft-capped by final_logit_softcapping when set.
//
// It also exports the language model of Gemma-3 multimodal checkpoints
// (model_type gemma3, Gemma3ForConditionalGeneration), text only: the same
// layers, their fields in text_config, their keys where transformers saves
// them and the Hub's releases hold them (language_model.model., the untied
// head language_model.lm_head.weight), the vision tower and projector left
// unbound. Gemma3ForConditionalGeneration embeds text tokens as
// Gemma3ForCausalLM does but never applies final_logit_softcapping. Its
// keys come in every layout transformers loads (mmPrefixes).
package gemma3

import (
	"fmt"
	"math"
	"slices"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/hf"
)

// Plugin is the gemma3 plugin; cmd/strata-plugin-gemma3 serves it.
func Plugin() sdk.Architecture { return plugin }

const (
	kindSliding, kindFull = "sliding", "full"
	ctxSlidingMask        = "sliding_mask"
	localRoPE             = "rope_local" // the sliding layers' tables
)

// mmPrefixes are where Gemma3ForConditionalGeneration checkpoints hold the
// language model, each a layout transformers loads (its llava key
// conversion and legacy renamings, conversion_mapping.py): the Hub's
// releases and transformers' save_pretrained write language_model.model.;
// model.language_model. is how transformers ≥ 4.52 holds the model in
// memory, and what tools saving its state_dict write; language_model. is a
// Gemma3Model's (no head); the doubled .model.model. a transformers
// 5.10–5.23 save. The head is language_model.lm_head.weight or
// lm_head.weight in any of them.
var (
	mmPrefixes = []string{"language_model.model.", "model.language_model.", "language_model.",
		"model.language_model.model.", "language_model.model.model."}
	mmHeads = []string{"language_model.lm_head.weight", "lm_head.weight"}
)

var plugin = decoder.Plugin{Name: "gemma3", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "gemma3_text", HFArchitectures: []string{"Gemma3ForCausalLM"}, Name: "Gemma3",
	Defaults: defaults, Load: load,
}, {
	ModelType: "gemma3", HFArchitectures: []string{"Gemma3ForConditionalGeneration"}, Name: "Gemma3",
	ConfigObject: "text_config", Prefixes: mmPrefixes, HeadKeys: mmHeads, Defaults: defaults, Load: loadConditional,
}}}

// defaults are Gemma3TextConfig's for the fields the plugin reads:
// head_dim and num_key_value_heads fixed (not derived from the heads), tied
// embeddings, the full layers' rope_theta and the sliding ones' base
// (its default_theta's global and local).
var defaults = map[string]any{
	"head_dim": 256, "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
	"rope_theta": 1e6, "rope_local_base_freq": 1e4, "max_position_embeddings": 131072,
	"query_pre_attn_scalar": 256, "sliding_window": 4096, "hidden_activation": string(blocks.ActGELUTanh),
}

// load refuses what Gemma-3's math does not have and declares the sliding
// and full layer kinds.
func load(m *decoder.Model) error { return loadText(m, false) }

// loadConditional loads the language model of a Gemma3ForConditionalGeneration
// checkpoint: tie_word_embeddings is the top-level field (the one
// transformers obeys), an untied head is one of mmHeads, and text_config's
// final_logit_softcapping is not applied.
func loadConditional(m *decoder.Model) error { return loadText(m, true) }

func loadText(m *decoder.Model, conditional bool) error {
	if conditional {
		tied, err := m.Top.BoolOr("tie_word_embeddings", true)
		if err != nil {
			return err
		}
		m.Tied = tied
	}
	if err := refuse(m); err != nil {
		return err
	}
	sliding, err := layerTypes(m)
	if err != nil {
		return err
	}
	full, local, err := ropes(m)
	if err != nil {
		return err
	}
	scalar := m.Float("query_pre_attn_scalar")
	bias := m.BoolOr("attention_bias", false)
	if m.Err != nil {
		return m.Err
	}
	if !(scalar > 0) || math.IsInf(scalar, 0) {
		return fmt.Errorf("config.json: query_pre_attn_scalar must be a finite number > 0, got %g", scalar)
	}
	if err := softCaps(m); err != nil {
		return err
	}
	if conditional && m.FinalSoftCap != 0 {
		m.Note("text_config.final_logit_softcapping %g is not applied: transformers' Gemma3ForConditionalGeneration never applies it", m.FinalSoftCap)
		m.FinalSoftCap = 0
	}
	m.RoPE, m.NormOnePlus, m.EmbedScale = full, true, math.Sqrt(float64(m.Hidden))
	m.KindOf = func(i int) string {
		if sliding[i] {
			return kindSliding
		}
		return kindFull
	}
	body := func(mask, rope string) func(l *decoder.Layer) error {
		return func(l *decoder.Layer) error {
			attention := &decoder.Attention{QKVBias: bias, OBias: bias, QKNorm: true, Scaling: math.Pow(scalar, -0.5), Mask: mask, RoPE: rope}
			return l.Residual(attention, decoder.Norms{Pre: "input_layernorm", Post: "post_attention_layernorm"},
				&decoder.SwiGLU{Width: m.Intermediate, Act: blocks.ActGELUTanh},
				decoder.Norms{Pre: "pre_feedforward_layernorm", Post: "post_feedforward_layernorm"})
		}
	}
	m.Kind(kindFull, "Gemma3DecoderLayer", body("", ""))
	if slices.Contains(sliding, true) {
		if slices.Contains(m.Config.Keys(), "sliding_window") && !m.Config.Has("sliding_window") {
			return fmt.Errorf("config.json: sliding_window is null, but layer_types names sliding_attention layers")
		}
		window := m.Int("sliding_window")
		if m.Err != nil {
			return m.Err
		}
		if window < 1 {
			return fmt.Errorf("config.json: sliding_window must be positive, got %d", window)
		}
		m.AddContext(decoder.SlidingWindow(ctxSlidingMask, window))
		m.AddRoPE(localRoPE, local)
		m.Kind(kindSliding, "Gemma3SlidingDecoderLayer", body(ctxSlidingMask, localRoPE))
		m.Note("sliding_attention layers keep a ctx_len KV cache like the others, masked to the last %d positions", window)
	}
	return m.Err
}

// refuse refuses, by name, config fields that change the math in ways
// the plugin does not compute.
func refuse(m *decoder.Model) error {
	if act := m.StringOr("hidden_activation", string(blocks.ActGELUTanh)); m.Err == nil && act != string(blocks.ActGELUTanh) {
		return fmt.Errorf("config.json: hidden_activation %q is not supported by the gemma3 plugin (only gelu_pytorch_tanh)", act)
	}
	if m.BoolOr("use_bidirectional_attention", false) {
		return fmt.Errorf("config.json: use_bidirectional_attention is not supported by the gemma3 plugin (the export is causal)")
	}
	if m.Config.Has("partial_rotary_factor") {
		return fmt.Errorf("config.json: partial_rotary_factor is not supported by the gemma3 plugin: transformers' Gemma-3 rotates the whole head")
	}
	return m.Err
}

// softCaps reads the soft-caps (null, Gemma-3's default, for none):
// final_logit_softcapping caps the logits as Gemma3ForCausalLM does;
// attn_logit_softcapping is checked but, as in transformers' Gemma-3 (its
// attention never passes it on, in any attention implementation), not
// applied.
func softCaps(m *decoder.Model) error {
	for _, field := range []string{"attn_logit_softcapping", "final_logit_softcapping"} {
		if !m.Config.Has(field) {
			continue
		}
		c := m.Float(field)
		if m.Err != nil {
			return m.Err
		}
		if !(c > 0) || math.IsInf(c, 0) {
			return fmt.Errorf("config.json: %s must be a finite number > 0 (or null), got %g", field, c)
		}
		if field == "final_logit_softcapping" {
			m.FinalSoftCap = c
		} else {
			m.Note("attn_logit_softcapping %g is not applied: transformers' Gemma-3 attention ignores it", c)
		}
	}
	return nil
}

// layerTypes reads layer_types, or, absent, Gemma3TextConfig's default:
// layer i slides unless (i+1) is a multiple of sliding_window_pattern (6).
func layerTypes(m *decoder.Model) ([]bool, error) {
	types := m.Strings("layer_types")
	pattern := m.IntOr("sliding_window_pattern", 6)
	if m.Err != nil {
		return nil, m.Err
	}
	sliding := make([]bool, m.Layers)
	if types == nil {
		if pattern < 1 {
			return nil, fmt.Errorf("config.json: sliding_window_pattern must be positive, got %d", pattern)
		}
		for i := range sliding {
			sliding[i] = (i+1)%pattern != 0
		}
		return sliding, nil
	}
	if len(types) != m.Layers {
		return nil, fmt.Errorf("config.json: layer_types has %d entries; num_hidden_layers is %d", len(types), m.Layers)
	}
	for i, t := range types {
		switch t {
		case "sliding_attention":
			sliding[i] = true
		case "full_attention":
		default:
			return nil, fmt.Errorf("config.json: layer_types[%d] is %q; Gemma-3 layers are sliding_attention or full_attention", i, t)
		}
	}
	return sliding, nil
}

// ropes reads the full layers' RoPE and the sliding layers' from either
// form transformers reads: rope_parameters.{full_attention,
// sliding_attention} (what transformers 5 saves), or rope_theta with
// rope_scaling for the full layers and rope_local_base_freq for the sliding
// ones (the Hub's configs).
func ropes(m *decoder.Model) (full, local blocks.RoPE, err error) {
	theta, localTheta := m.Float("rope_theta"), m.Float("rope_local_base_freq")
	params, nested := m.Object("rope_parameters")
	if m.Err != nil {
		return full, local, m.Err
	}
	var fullCfg, localCfg hf.Config
	fullName, localName := "rope_scaling", ""
	if nested {
		if !params.Has("full_attention") && !params.Has("sliding_attention") {
			return full, local, fmt.Errorf("config.json: rope_parameters must hold full_attention and sliding_attention objects (Gemma-3's per-layer-type RoPE)")
		}
		fullName, localName = "rope_parameters.full_attention", "rope_parameters.sliding_attention"
		if fullCfg, _, err = params.Object("full_attention"); err != nil {
			return full, local, err
		}
		if localCfg, _, err = params.Object("sliding_attention"); err != nil {
			return full, local, err
		}
	} else if fullCfg, _ = m.Object("rope_scaling"); m.Err != nil {
		return full, local, m.Err
	}
	if full, err = rope(m, fullCfg, fullName, theta, "rope_theta"); err != nil {
		return full, local, err
	}
	local, err = rope(m, localCfg, localName, localTheta, "rope_local_base_freq")
	return full, local, err
}

// rope is the RoPE of one layer type: c (named name, if present) gives
// its kind and parameters (blocks.RoPEFromParams) and rope_theta, else
// theta, read from the field where. The plugin computes the kinds
// checked against transformers' Gemma-3: default and linear.
func rope(m *decoder.Model, c hf.Config, name string, theta float64, where string) (blocks.RoPE, error) {
	if c.Has("partial_rotary_factor") {
		return blocks.RoPE{}, fmt.Errorf("config.json: %s.partial_rotary_factor is not supported by the gemma3 plugin: transformers' Gemma-3 rotates the whole head", name)
	}
	r, err := blocks.RoPEFromParams(blocks.RoPEParams{Config: c, Name: name, Top: m.Config}, theta, where, m.HeadDim)
	if err == nil && r.Type != "default" && r.Type != "linear" {
		err = fmt.Errorf("config.json: %s: rope type %q is not supported by the gemma3 plugin (supported: default, linear)", name, r.Type)
	}
	return r, err
}
