package blocks

import (
	"math"

	"github.com/strata-llm/strata/sdk/fn"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// QuantDomain holds the activation quantisation functions strata ships with
// a model whose checkpoint quantises the inputs of its linear layers.
const QuantDomain = "ai.strata.quant"

// fp8Max is the largest finite E4M3FN value.
const fp8Max = 448

// FP8DynamicPerTokenFunc is FP8DynamicPerToken(x [..., K]) -> x quantised to
// FP8 E4M3 and back, one scale per row of the last axis, as
// compressed-tensors' FP8_DYNAMIC input activations compute it: scale =
// max|x| / 448 (a zero scale becomes float32's eps), q = x / scale clamped
// to ±448 and rounded to the nearest E4M3 value (ties to even), y = q ×
// scale. The body is in float32 whatever x is: x is cast in and the result
// cast back like x.
//
// Opset 17 has no FP8 type, so the rounding is spelled out: an E4M3 value
// of magnitude in [2^e, 2^(e+1)) (e ≥ -6; below that, subnormals spaced
// 2^-9) is a multiple of 2^(e-3), so q = Round(v / step) × step with step
// chosen by counting the powers of two |v| reaches — exact comparisons, not
// a logarithm.
func FP8DynamicPerTokenFunc() *onnxpb.FunctionProto {
	f := fn.NewFunc(QuantDomain, "FP8DynamicPerToken", fn.Float32)
	in := f.Input("x")
	x := f.Cast(in, fn.Float32)
	amax := f.ReduceMax(f.Op("Abs", []fn.Value{x}), true, -1)
	scale := f.Div(amax, f.Scalar(fp8Max))
	eps := f.Scalar(float32(math.Nextafter32(1, 2) - 1))
	scale = f.Where(f.Op("Equal", []fn.Value{scale, f.Scalar(0)}), eps, scale)
	v := f.Op("Clip", []fn.Value{f.Div(x, scale), f.Scalar(-fp8Max), f.Scalar(fp8Max)})
	thresholds := make([]float32, 0, 15) // 2^-5 .. 2^8: the binades above the subnormals
	steps := []float32{float32(math.Ldexp(1, -9))}
	for e := -5; e <= 8; e++ {
		thresholds = append(thresholds, float32(math.Ldexp(1, e)))
		steps = append(steps, float32(math.Ldexp(1, e-3)))
	}
	reached := f.Op("GreaterOrEqual", []fn.Value{f.Unsqueeze(f.Op("Abs", []fn.Value{v}), -1), f.Floats(thresholds...)})
	binade := f.Op("ReduceSum", []fn.Value{f.Cast(reached, fn.Int64), f.Ints(-1)}, fn.AttrInt("keepdims", 0))
	step := f.Gather(f.Floats(steps...), binade, 0)
	q := f.Mul(f.Op("Round", []fn.Value{f.Div(v, step)}), step)
	f.Output("y", f.CastLike(f.Mul(q, scale), in))
	return f.Proto()
}
