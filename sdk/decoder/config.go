package decoder

import (
	"fmt"
	"math"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/hf"
)

// Common are the config.json fields every decoder-only LM has, read once
// here with errors that name the field.
type Common struct {
	Hidden, Intermediate, Layers int
	Heads, KVHeads, HeadDim      int
	Vocab                        int
	Eps                          float64 // rms_norm_eps
	Tied                         bool    // tie_word_embeddings
	RoPE                         blocks.RoPE
}

// ParseCommon reads the common fields from r (num_key_value_heads defaults
// to the heads, head_dim to hidden/heads; intermediate_size may be absent,
// 0, for models without a dense MLP, Qwen3.5-MoE) and checks their domain.
// Errors go to r.Err, the first one kept.
func ParseCommon(r *hf.Reader) Common {
	c := Common{
		Hidden: r.Int("hidden_size"), Intermediate: r.IntOr("intermediate_size", 0),
		Layers: r.Int("num_hidden_layers"), Heads: r.Int("num_attention_heads"), Vocab: r.Int("vocab_size"),
		Eps: r.FloatOr("rms_norm_eps", 1e-6), Tied: r.BoolOr("tie_word_embeddings", false),
	}
	if r.Err != nil {
		return c
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden_size", c.Hidden}, {"intermediate_size", c.Intermediate}, {"num_hidden_layers", c.Layers},
		{"num_attention_heads", c.Heads}, {"vocab_size", c.Vocab}} {
		if f.v <= 0 && (f.name != "intermediate_size" || r.Config.Has(f.name)) {
			r.Err = fmt.Errorf("%s: %s must be positive, got %d", r.Config.Path(), f.name, f.v)
			return c
		}
	}
	if c.Eps < 0 || math.IsNaN(c.Eps) || math.IsInf(c.Eps, 0) {
		r.Err = fmt.Errorf("%s: rms_norm_eps must be a finite number ≥ 0, got %g", r.Config.Path(), c.Eps)
		return c
	}
	c.KVHeads = r.IntOr("num_key_value_heads", c.Heads)
	c.HeadDim = r.IntOr("head_dim", c.Hidden/c.Heads)
	switch {
	case r.Err != nil:
		return c
	case c.KVHeads <= 0 || c.Heads%c.KVHeads != 0:
		r.Err = fmt.Errorf("%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", r.Config.Path(), c.Heads, c.KVHeads)
		return c
	case c.HeadDim <= 0:
		r.Err = fmt.Errorf("%s: head_dim must be positive, got %d", r.Config.Path(), c.HeadDim)
		return c
	}
	var err error
	if c.RoPE, err = blocks.RoPEFromConfig(r.Config, c.HeadDim); err != nil {
		r.Err = err
	}
	return c
}

// RequireSiLU refuses a hidden_act other than silu (the gated MLPs here).
func RequireSiLU(r *hf.Reader, plugin string) {
	if act := r.StringOr("hidden_act", "silu"); r.Err == nil && act != "silu" {
		r.Err = fmt.Errorf("%s: hidden_act %q is not supported by the %s plugin (only silu)", r.Config.Path(), act, plugin)
	}
}
