package blocks

import (
	"github.com/strata-llm/strata/sdk/fn"

	"fmt"
	"math"

	"github.com/strata-llm/strata/sdk/hf"
)

// RoPE describes rotary position embeddings (rotate-half layout) as
// transformers computes them: inv_freq from the base and the rope type,
// cos/sin from position_ids in float32, scaled by AttentionScaling.
type RoPE struct {
	Type string  // default, linear, llama3
	Base float64 // rope_theta
	Dim  int     // rotated dimensions: head_dim * partial_rotary_factor

	Factor               float64 // linear, llama3
	LowFreqFactor        float64 // llama3
	HighFreqFactor       float64 // llama3
	OriginalMaxPositions float64 // llama3

	AttentionScaling float64 // multiplies cos and sin; 1 for these types
}

// RoPEFromConfig reads rope settings from either place transformers keeps
// them: top-level rope_theta + rope_scaling (≤ 4.x configs) or
// rope_parameters (5.x configs).
func RoPEFromConfig(c hf.Config, headDim int) (RoPE, error) {
	params, hasParams, err := c.Object("rope_parameters")
	if err != nil {
		return RoPE{}, err
	}
	scaling, hasScaling, err := c.Object("rope_scaling")
	if err != nil {
		return RoPE{}, err
	}
	r := RoPE{Type: "default", AttentionScaling: 1}
	if r.Base, err = c.FloatOr("rope_theta", 10000); err != nil {
		return RoPE{}, err
	}
	partial, err := c.FloatOr("partial_rotary_factor", 1)
	if err != nil {
		return RoPE{}, err
	}
	src := scaling
	if hasParams {
		src, hasScaling = params, true
		if r.Base, err = params.FloatOr("rope_theta", r.Base); err != nil {
			return RoPE{}, err
		}
		if partial, err = params.FloatOr("partial_rotary_factor", partial); err != nil {
			return RoPE{}, err
		}
	}
	r.Dim = int(float64(headDim) * partial)
	if r.Dim <= 0 || r.Dim%2 != 0 || r.Dim > headDim {
		return RoPE{}, fmt.Errorf("config.json: rotary dimension %d (head_dim %d × partial_rotary_factor %g) must be even and in 2..head_dim", r.Dim, headDim, partial)
	}
	if hasScaling {
		if err := r.readScaling(src); err != nil {
			return RoPE{}, err
		}
	}
	return r, nil
}

func (r *RoPE) readScaling(s hf.Config) error {
	typ, err := s.StringOr("rope_type", "")
	if err != nil {
		return err
	}
	if typ == "" {
		if typ, err = s.StringOr("type", "default"); err != nil {
			return err
		}
	}
	r.Type = typ
	switch typ {
	case "default":
		return nil
	case "linear":
		r.Factor, err = s.Float("factor")
		return err
	case "llama3":
		return r.readLlama3(s)
	default:
		return fmt.Errorf("config.json: rope type %q is not supported (supported: default, linear, llama3)", typ)
	}
}

func (r *RoPE) readLlama3(s hf.Config) error {
	var err error
	if r.Factor, err = s.Float("factor"); err != nil {
		return err
	}
	if r.LowFreqFactor, err = s.Float("low_freq_factor"); err != nil {
		return err
	}
	if r.HighFreqFactor, err = s.Float("high_freq_factor"); err != nil {
		return err
	}
	if r.OriginalMaxPositions, err = s.Float("original_max_position_embeddings"); err != nil {
		return err
	}
	if r.HighFreqFactor <= r.LowFreqFactor {
		return fmt.Errorf("config.json: llama3 rope scaling needs high_freq_factor (%g) > low_freq_factor (%g)", r.HighFreqFactor, r.LowFreqFactor)
	}
	return nil
}

// InvFreq is the [Dim/2] inverse-frequency table, in float32 arithmetic step
// by step as transformers computes it, so the tables match to the last bit
// wherever the math library does.
func (r RoPE) InvFreq() []float32 {
	half := r.Dim / 2
	inv := make([]float32, half)
	base := float64(float32(r.Base))
	for i := range inv {
		exp := float32(2*i) / float32(r.Dim)
		inv[i] = 1 / float32(math.Pow(base, float64(exp)))
	}
	switch r.Type {
	case "linear":
		for i := range inv {
			inv[i] /= float32(r.Factor)
		}
	case "llama3":
		r.llama3(inv)
	}
	return inv
}

// llama3 applies Llama 3.1 frequency scaling: long wavelengths divided by
// factor, short ones kept, a smooth blend in between. Scalar-by-tensor
// divisions are reciprocal-then-multiply, as torch evaluates them.
func (r RoPE) llama3(inv []float32) {
	factor := float32(r.Factor)
	old := float32(r.OriginalMaxPositions)
	lowWavelen := float32(r.OriginalMaxPositions / r.LowFreqFactor)
	highWavelen := float32(r.OriginalMaxPositions / r.HighFreqFactor)
	span := float32(r.HighFreqFactor - r.LowFreqFactor)
	for i, f := range inv {
		wavelen := (1 / f) * float32(2*math.Pi)
		scaled := f
		if wavelen > lowWavelen {
			scaled = f / factor
		}
		smooth := ((1/wavelen)*old - float32(r.LowFreqFactor)) / span
		medium := !(wavelen < highWavelen) && !(wavelen > lowWavelen)
		if medium {
			scaled = (1-smooth)*scaled/factor + smooth*scaled
		}
		inv[i] = scaled
	}
}

// Tables computes cos and sin [B,1,S,Dim] in the compute dtype from int64
// position_ids [B,S], once per model.
func (r RoPE) Tables(f *fn.Func, positionIDs fn.Value) (cos, sin fn.Value) {
	pos := f.Unsqueeze(f.Cast(positionIDs, fn.Float32), -1) // [B,S,1]
	freqs := f.Mul(pos, f.Floats(r.InvFreq()...))           // [B,S,Dim/2]
	emb := f.Concat(-1, freqs, freqs)
	cos, sin = f.Cos(emb), f.Sin(emb)
	if r.AttentionScaling != 1 {
		scale := f.ScalarOf(fn.Float32, float32(r.AttentionScaling))
		cos, sin = f.Mul(cos, scale), f.Mul(sin, scale)
	}
	cos = f.Unsqueeze(f.CastTo(cos, fn.Float32, f.DType()), 1)
	sin = f.Unsqueeze(f.CastTo(sin, fn.Float32, f.DType()), 1)
	return cos, sin
}

// Apply rotates x [B,n,S,headDim] by the tables; with a partial rotary
// dimension only the first Dim channels turn.
func (r RoPE) Apply(f *fn.Func, x, cos, sin fn.Value, headDim int) fn.Value {
	if r.Dim == headDim {
		return rotate(f, x, cos, sin, r.Dim)
	}
	parts := f.Split(x, -1, int64(r.Dim), int64(headDim-r.Dim))
	return f.Concat(-1, rotate(f, parts[0], cos, sin, r.Dim), parts[1])
}

// rotate is x·cos + rotate_half(x)·sin with rotate_half([a,b]) = [-b,a].
func rotate(f *fn.Func, x, cos, sin fn.Value, dim int) fn.Value {
	halves := f.Split(x, -1, int64(dim/2), int64(dim/2))
	rotated := f.Concat(-1, f.Neg(halves[1]), halves[0])
	return f.Add(f.Mul(x, cos), f.Mul(rotated, sin))
}
