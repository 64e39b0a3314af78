package blocks

import (
	"fmt"
	"math"
	"strings"

	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/hf"
)

// RoPE describes rotary position embeddings (rotate-half layout) as
// transformers computes them: inv_freq from the base and the rope type,
// cos/sin from position_ids in float32, scaled by AttentionScaling.
type RoPE struct {
	Type string  // the RoPE kind (rope_type): RoPEKinds lists them
	Base float64 // rope_theta
	Dim  int     // rotated dimensions: head_dim * partial_rotary_factor

	Factor               float64 // linear, llama3, yarn
	LowFreqFactor        float64 // llama3
	HighFreqFactor       float64 // llama3
	OriginalMaxPositions float64 // llama3, yarn, longrope

	// yarn: the ramp between extrapolated and interpolated frequencies
	// runs over the dimensions rotating BetaFast down to BetaSlow times in
	// OriginalMaxPositions; Truncate rounds its ends outward to integers.
	BetaFast, BetaSlow float64
	Truncate           bool

	// longrope (Phi-3): one divisor per rotated frequency, ShortFactor's
	// while the largest position id + 1 is at most OriginalMaxPositions,
	// LongFactor's beyond (chosen per call, see Tables).
	ShortFactor, LongFactor []float64

	// MRoPESection is [t, h, w] for interleaved multimodal RoPE (Qwen3-VL):
	// see Tables3. Nil for 1-D RoPE.
	MRoPESection []int

	AttentionScaling float64 // multiplies cos and sin; 1 except for yarn and longrope

	// Params holds a plugin-registered kind's own parameters, as its
	// RoPEKind.Read stores them for its InvFreq.
	Params any
}

// RoPEFromConfig reads rope settings from either place transformers keeps
// them: top-level rope_theta + rope_scaling (≤ 4.x configs) or
// rope_parameters (5.x configs). c is the (text) config object itself: yarn
// reads max_position_embeddings (and a top-level
// original_max_position_embeddings, which transformers prefers) from it.
// Values transformers would turn into NaN or infinite frequencies are
// refused with an error naming the field.
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
	src, srcName, where := scaling, "rope_scaling", "rope_theta"
	if hasParams {
		src, srcName, hasScaling = params, "rope_parameters", true
		if params.Has("rope_theta") {
			where = "rope_parameters.rope_theta"
		}
		if r.Base, err = params.FloatOr("rope_theta", r.Base); err != nil {
			return RoPE{}, err
		}
		if partial, err = params.FloatOr("partial_rotary_factor", partial); err != nil {
			return RoPE{}, err
		}
	}
	if err := positive(where, r.Base); err != nil {
		return RoPE{}, err
	}
	if !(partial > 0 && partial <= 1) {
		return RoPE{}, fmt.Errorf("config.json: partial_rotary_factor %g must be in (0, 1]", partial)
	}
	r.Dim = int(float64(headDim) * partial)
	if r.Dim <= 0 || r.Dim%2 != 0 || r.Dim > headDim {
		return RoPE{}, fmt.Errorf("config.json: rotary dimension %d (head_dim %d × partial_rotary_factor %g) must be even and in 2..head_dim", r.Dim, headDim, partial)
	}
	if hasScaling {
		if err := r.readScaling(src, srcName, c); err != nil {
			return RoPE{}, err
		}
	}
	return r, nil
}

// RoPEFromParams reads one rope parameter object for dim rotated
// dimensions: its kind (rope_type, else type, else default) and that kind's
// parameters, and its rope_theta, else base (read from the field where).
// It is what RoPEFromConfig does with the object it finds, for
// architectures that keep several (Gemma-3's rope_parameters.full_attention
// and .sliding_attention); p with a zero Config (the object is absent) is
// the default kind at base.
func RoPEFromParams(p RoPEParams, base float64, where string, dim int) (RoPE, error) {
	r := RoPE{Type: "default", Base: base, Dim: dim, AttentionScaling: 1}
	if p.Has("rope_theta") {
		where = p.Name + ".rope_theta"
		var err error
		if r.Base, err = p.Float("rope_theta"); err != nil {
			return RoPE{}, err
		}
	}
	if err := positive(where, r.Base); err != nil {
		return RoPE{}, err
	}
	if dim <= 0 || dim%2 != 0 {
		return RoPE{}, fmt.Errorf("config.json: %s: rotary dimension %d must be even and positive", p.Name, dim)
	}
	if err := r.readScaling(p.Config, p.Name, p.Top); err != nil {
		return RoPE{}, err
	}
	return r, nil
}

// positive checks a config value is a finite number > 0.
func positive(field string, v float64) error {
	if !(v > 0) || math.IsInf(v, 0) {
		return fmt.Errorf("config.json: %s must be a finite number > 0, got %g", field, v)
	}
	return nil
}

// readScaling reads the rope type's parameters from s, called name
// (rope_scaling or rope_parameters); top is the whole config.
func (r *RoPE) readScaling(s hf.Config, name string, top hf.Config) error {
	typ, err := s.StringOr("rope_type", "")
	if err != nil {
		return err
	}
	if typ == "" {
		if typ, err = s.StringOr("type", "default"); err != nil {
			return err
		}
	}
	k, ok := lookupRoPEKind(typ)
	if !ok {
		return fmt.Errorf("config.json: %s: rope type %q is not supported (supported: %s); a plugin adds a kind with blocks.RegisterRoPEKind", name, typ, strings.Join(RoPEKinds(), ", "))
	}
	r.Type = typ
	if err := r.readMRoPE(s); err != nil {
		return err
	}
	if k.Read == nil {
		return nil
	}
	return k.Read(r, RoPEParams{Config: s, Name: name, Top: top})
}

// readMRoPE reads Qwen3-VL's interleaved mrope_section, if any.
func (r *RoPE) readMRoPE(s hf.Config) error {
	if !s.Has("mrope_section") {
		return nil
	}
	section, err := s.Ints("mrope_section")
	if err != nil {
		return err
	}
	interleaved, err := s.BoolOr("mrope_interleaved", r.Type != "mrope")
	if err != nil {
		return err
	}
	if !interleaved {
		return fmt.Errorf("config.json: non-interleaved MRoPE (mrope_interleaved false, Qwen2-VL style) is not supported")
	}
	return r.SetMRoPE(section)
}

// SetMRoPE sets the interleaved MRoPE section [t, h, w]. As transformers'
// Qwen3-VL recomposes the frequencies, t is not read (the frequencies left
// turn with the T row) and the H and W strides stop at the rotary width:
// sections need not sum to it, nor fit in it (mropeRow clips).
func (r *RoPE) SetMRoPE(section []int) error {
	if len(section) != 3 {
		return fmt.Errorf("config.json: mrope_section %v must be 3 sizes [t, h, w]", section)
	}
	for _, n := range section {
		if n < 0 {
			return fmt.Errorf("config.json: mrope_section %v has a negative entry", section)
		}
	}
	r.MRoPESection = section
	return nil
}

func (r *RoPE) readLlama3(s hf.Config, name string) error {
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
	for _, v := range []struct {
		name string
		v    float64
	}{{"factor", r.Factor}, {"low_freq_factor", r.LowFreqFactor}, {"high_freq_factor", r.HighFreqFactor},
		{"original_max_position_embeddings", r.OriginalMaxPositions}} {
		if err := positive(name+"."+v.name, v.v); err != nil {
			return err
		}
	}
	if r.HighFreqFactor <= r.LowFreqFactor {
		return fmt.Errorf("config.json: llama3 rope scaling needs high_freq_factor (%g) > low_freq_factor (%g)", r.HighFreqFactor, r.LowFreqFactor)
	}
	return nil
}

// readYarn reads yarn's parameters with transformers' defaults: beta_fast
// 32 and beta_slow 1 (also when 0, as Python's `or` has it), truncate true,
// original_max_position_embeddings from the top level if there (Phi-3's
// exception), else from s, else max_position_embeddings; a missing factor
// is max_position_embeddings / original_max_position_embeddings.
func (r *RoPE) readYarn(s hf.Config, name string, top hf.Config) error {
	maxPos, err := r.readOriginalMax(s, name, top, "yarn")
	if err != nil {
		return err
	}
	if s.Has("factor") {
		if r.Factor, err = s.Float("factor"); err != nil {
			return err
		}
		if err := positive(name+".factor", r.Factor); err != nil {
			return err
		}
	} else {
		if err := positive("max_position_embeddings (yarn without a factor)", maxPos); err != nil {
			return err
		}
		r.Factor = maxPos / r.OriginalMaxPositions
	}
	if r.Base == 1 {
		return fmt.Errorf("config.json: yarn rope scaling needs rope_theta ≠ 1 (its correction range divides by log(rope_theta))")
	}
	if r.BetaFast, err = s.FloatOr("beta_fast", 0); err != nil {
		return err
	}
	if r.BetaSlow, err = s.FloatOr("beta_slow", 0); err != nil {
		return err
	}
	if r.BetaFast == 0 {
		r.BetaFast = 32
	}
	if r.BetaSlow == 0 {
		r.BetaSlow = 1
	}
	if err := positive(name+".beta_slow", r.BetaSlow); err != nil {
		return err
	}
	// Equal betas are a zero-width ramp transformers widens (Kimi-K2's 1, 1).
	if !(r.BetaFast >= r.BetaSlow) || math.IsInf(r.BetaFast, 0) {
		return fmt.Errorf("config.json: %s.beta_fast (%g) must be a finite number ≥ beta_slow (%g)", name, r.BetaFast, r.BetaSlow)
	}
	if r.Truncate, err = s.BoolOr("truncate", true); err != nil {
		return err
	}
	return r.readYarnAttentionFactor(s, name)
}

// readOriginalMax sets OriginalMaxPositions as standardize_rope_params
// does for yarn and longrope: the top-level original_max_position_embeddings
// if there, else s's, else max_position_embeddings. It returns
// max_position_embeddings (0 when absent).
func (r *RoPE) readOriginalMax(s hf.Config, name string, top hf.Config, typ string) (maxPos float64, err error) {
	if maxPos, err = top.FloatOr("max_position_embeddings", 0); err != nil {
		return 0, err
	}
	omaxField := name + ".original_max_position_embeddings"
	switch {
	case top.Has("original_max_position_embeddings"):
		omaxField = "original_max_position_embeddings"
		r.OriginalMaxPositions, err = top.Float("original_max_position_embeddings")
	case s.Has("original_max_position_embeddings"):
		r.OriginalMaxPositions, err = s.Float("original_max_position_embeddings")
	case top.Has("max_position_embeddings"):
		omaxField, r.OriginalMaxPositions = "max_position_embeddings", maxPos
	default:
		return 0, fmt.Errorf("config.json: %s rope scaling needs %s (or max_position_embeddings)", typ, omaxField)
	}
	if err != nil {
		return 0, err
	}
	return maxPos, positive(omaxField, r.OriginalMaxPositions)
}

// readLongRoPE reads longrope as transformers' _compute_longrope_parameters:
// short_factor and long_factor (one per rotated frequency), the original
// length as readOriginalMax, factor if given else max_position_embeddings /
// original, and attention_factor if given, else 1 for factor ≤ 1, else
// sqrt(1 + ln(factor) / ln(original)).
func (r *RoPE) readLongRoPE(s hf.Config, name string, top hf.Config) error {
	if r.MRoPESection != nil {
		return fmt.Errorf("config.json: longrope with mrope_section (multimodal RoPE) is not supported")
	}
	maxPos, err := r.readOriginalMax(s, name, top, "longrope")
	if err != nil {
		return err
	}
	for _, f := range []struct {
		key string
		dst *[]float64
	}{{"short_factor", &r.ShortFactor}, {"long_factor", &r.LongFactor}} {
		if *f.dst, err = s.Floats(f.key); err != nil {
			return err
		}
		if len(*f.dst) != r.Dim/2 {
			return fmt.Errorf("config.json: %s.%s has %d entries; longrope needs one per rotated frequency (rotary dimension %d / 2 = %d)", name, f.key, len(*f.dst), r.Dim, r.Dim/2)
		}
		for i, v := range *f.dst {
			if err := positive(fmt.Sprintf("%s.%s[%d]", name, f.key, i), v); err != nil {
				return err
			}
		}
	}
	factor := 0.0
	if s.Has("factor") {
		if factor, err = s.Float("factor"); err != nil {
			return err
		}
		if err := positive(name+".factor", factor); err != nil {
			return err
		}
	} else {
		if err := positive("max_position_embeddings (longrope without a factor)", maxPos); err != nil {
			return err
		}
		factor = maxPos / r.OriginalMaxPositions
	}
	if s.Has("attention_factor") {
		if r.AttentionScaling, err = s.Float("attention_factor"); err != nil {
			return err
		}
		return positive(name+".attention_factor", r.AttentionScaling)
	}
	if factor > 1 {
		if r.OriginalMaxPositions <= 1 {
			return fmt.Errorf("config.json: longrope's attention factor divides by ln(original_max_position_embeddings); %g must be > 1 (or give attention_factor)", r.OriginalMaxPositions)
		}
		r.AttentionScaling = math.Sqrt(1 + math.Log(factor)/math.Log(r.OriginalMaxPositions))
	}
	return nil
}

// readYarnAttentionFactor: attention_factor if given, else
// get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both
// are set (and non-zero), else get_mscale(factor).
func (r *RoPE) readYarnAttentionFactor(s hf.Config, name string) error {
	if s.Has("attention_factor") {
		v, err := s.Float("attention_factor")
		if err != nil {
			return err
		}
		r.AttentionScaling = v
		return positive(name+".attention_factor", v)
	}
	mscale, err := s.FloatOr("mscale", 0)
	if err != nil {
		return err
	}
	mscaleAll, err := s.FloatOr("mscale_all_dim", 0)
	if err != nil {
		return err
	}
	getMscale := func(scale, m float64) float64 {
		if scale <= 1 {
			return 1
		}
		return 0.1*m*math.Log(scale) + 1
	}
	r.AttentionScaling = getMscale(r.Factor, 1)
	if mscale != 0 && mscaleAll != 0 {
		r.AttentionScaling = getMscale(r.Factor, mscale) / getMscale(r.Factor, mscaleAll)
	}
	if !(r.AttentionScaling > 0) || math.IsInf(r.AttentionScaling, 0) {
		return fmt.Errorf("config.json: %s: mscale %g and mscale_all_dim %g give attention factor %g; it must be finite and > 0", name, mscale, mscaleAll, r.AttentionScaling)
	}
	return nil
}

// InvFreq is the [Dim/2] inverse-frequency table of the RoPE's kind, in
// float32 arithmetic step by step as transformers computes it, so the
// tables match to the last bit wherever the math library does.
func (r RoPE) InvFreq() []float32 {
	if k := r.kind(); k.InvFreq != nil {
		return k.InvFreq(r, r.pow())
	}
	return defaultInvFreq(r.pow())
}

// LongInvFreq is the kind's table for positions beyond
// OriginalMaxPositions (RoPEKind.LongInvFreq: longrope's long factors);
// nil for a kind without one.
func (r RoPE) LongInvFreq() []float32 {
	if k := r.kind(); k.LongInvFreq != nil {
		return k.LongInvFreq(r, r.pow())
	}
	return nil
}

// pow is base^(2i/Dim) for i < Dim/2, in float32 as transformers'
// default inverse frequencies compute it before the reciprocal.
func (r RoPE) pow() []float32 {
	pow := make([]float32, r.Dim/2)
	base := float64(float32(r.Base))
	for i := range pow {
		exp := float32(2*i) / float32(r.Dim)
		pow[i] = float32(math.Pow(base, float64(exp)))
	}
	return pow
}

// defaultInvFreq is 1/pow: the default kind's table.
func defaultInvFreq(pow []float32) []float32 {
	inv := make([]float32, len(pow))
	for i, p := range pow {
		inv[i] = 1 / p
	}
	return inv
}

// longrope divides the default frequencies by the factors: 1 / (ext · pow)
// in float32, the factors rounded to float32 as torch.tensor does.
func longrope(pow []float32, factors []float64) []float32 {
	inv := make([]float32, len(pow))
	for i, p := range pow {
		inv[i] = 1 / float32(float32(factors[i])*p)
	}
	return inv
}

// yarn blends extrapolated (1/pow) and interpolated (1/(factor·pow))
// frequencies by a linear ramp over the correction range, as
// transformers' _compute_yarn_parameters: the range in float64 (Python
// floats), the tensors in float32, a tensor-by-scalar op rounding the scalar
// to float32 first. The explicit conversions keep Go from fusing a
// multiply-add.
func (r RoPE) yarn(pow []float32) []float32 {
	d := float64(r.Dim)
	corrDim := func(rotations float64) float64 {
		return (d * math.Log(r.OriginalMaxPositions/(rotations*2*math.Pi))) / (2 * math.Log(r.Base))
	}
	low, high := corrDim(r.BetaFast), corrDim(r.BetaSlow)
	if r.Truncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = max(low, 0), min(high, d-1)
	if low == high {
		high += 0.001 // transformers' guard against a zero-width ramp
	}
	lo32, span32, factor := float32(low), float32(high-low), float32(r.Factor)
	inv := make([]float32, len(pow))
	for i, p := range pow {
		ramp := min(max((float32(i)-lo32)/span32, 0), 1)
		extrapolation := 1 - ramp // weight of the unscaled frequency
		interp := 1 / float32(factor*p)
		extrap := 1 / p
		inv[i] = float32(interp*float32(1-extrapolation)) + float32(extrap*extrapolation)
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
	freqs := f.Mul(pos, r.invFreq(f, positionIDs))          // [B,S,Dim/2]
	return r.tables(f, freqs)
}

// invFreq is the frequency table for position_ids [B,S]. For a kind with a
// long table (longrope) it is chosen per call as transformers'
// longrope_frequency_update does: the long one when max(position_ids) + 1 >
// OriginalMaxPositions, over the whole batch, else the short one.
func (r RoPE) invFreq(f *fn.Func, positionIDs fn.Value) fn.Value {
	short := f.Floats(r.InvFreq()...)
	long := r.LongInvFreq()
	if long == nil {
		return short
	}
	// max + 1 > original ⇔ max > floor(original) - 1 for integer positions.
	last := f.Int(int64(math.Floor(r.OriginalMaxPositions)) - 1)
	beyond := f.Greater(f.ReduceMax(positionIDs, false, 0, 1), last)
	return f.Where(beyond, f.Floats(long...), short)
}

// Tables3 computes cos and sin [B,1,S,Dim] like Tables from int64 position
// ids [3,B,S] (temporal, height, width rows) for interleaved multimodal
// RoPE (Qwen3-VL): frequency j < Dim/2 turns with the H row if j%3 == 1 and
// j < 3·MRoPESection[1], with the W row if j%3 == 2 and j < 3·MRoPESection[2],
// else with the T row, as transformers' Qwen3VLTextRotaryEmbedding. With
// three equal rows (text only) the tables are those of Tables. Transformers
// 5.x passes four rows with the text positions first; drop that row.
func (r RoPE) Tables3(f *fn.Func, positionIDs3 fn.Value) (cos, sin fn.Value) {
	return r.mropeTables(f, positionIDs3, 0)
}

// Tables4 is Tables3 from position ids [4,B,S] whose row 0 is the text
// (sequence) position and rows 1..3 the temporal, height and width rows:
// the layout transformers' Qwen3-VL takes with vision inputs.
func (r RoPE) Tables4(f *fn.Func, positionIDs4 fn.Value) (cos, sin fn.Value) {
	return r.mropeTables(f, positionIDs4, 1)
}

// mropeTables reads the t/h/w rows from first on.
func (r RoPE) mropeTables(f *fn.Func, positionIDs fn.Value, first int64) (cos, sin fn.Value) {
	rows := make([]int64, r.Dim/2)
	for j := range rows {
		rows[j] = first + r.mropeRow(j)
	}
	// Pick each frequency's position row, then scale: the same float32
	// product as scaling all three rows and picking afterwards.
	pos := f.Gather(f.Cast(positionIDs, fn.Float32), f.Ints(rows...), 0) // [Dim/2,B,S]
	pos = f.Transpose(pos, 1, 2, 0)                                      // [B,S,Dim/2]
	return r.tables(f, f.Mul(pos, f.Floats(r.InvFreq()...)))
}

// mropeRow is the position row (0 T, 1 H, 2 W) frequency j turns with.
func (r RoPE) mropeRow(j int) int64 {
	if len(r.MRoPESection) != 3 {
		return 0
	}
	switch {
	case j%3 == 1 && j < 3*r.MRoPESection[1]:
		return 1
	case j%3 == 2 && j < 3*r.MRoPESection[2]:
		return 2
	}
	return 0
}

// tables finishes Tables and Tables3 from freqs [B,S,Dim/2].
func (r RoPE) tables(f *fn.Func, freqs fn.Value) (cos, sin fn.Value) {
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
