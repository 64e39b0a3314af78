package transform

import (
	"encoding/binary"
	"math"

	"github.com/x448/float16"

	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Decoding tables. Both lowerings use the same tables (the in-graph one as a
// Gather from a constant), so the two agree by construction on every code,
// NaNs included.

// fp4Values is the E2M1 code table (bit 3 is the sign), as gpt-oss and
// transformers define it.
var fp4Values = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}

// exp2Values[s] = 2^(s-127): the value of an E8M0 exponent byte (255 is NaN
// in E8M0; as transformers computes it, 2^128 overflows float32 to +Inf).
var exp2Values = func() (t [256]float32) {
	for s := range t {
		t[s] = float32(math.Ldexp(1, s-127))
	}
	return t
}()

// codeTable is the float32 value of every byte of a one-byte type: an FP8
// format, or (UINT8) an exponent byte as transformers reads MX scales.
func codeTable(t dtype.DType) [256]float32 {
	if t == onnxpb.TensorProto_UINT8 {
		return exp2Values
	}
	return fp8Values(t)
}

// fp8Values decodes every byte of an FP8 format to float32.
func fp8Values(t dtype.DType) [256]float32 {
	var table [256]float32
	for b := range table {
		table[b] = decodeFP8(uint8(b), t)
	}
	return table
}

func decodeFP8(b uint8, t dtype.DType) float32 {
	switch t {
	case onnxpb.TensorProto_FLOAT8E8M0:
		if b == 255 {
			return float32(math.NaN())
		}
		return exp2Values[b]
	case onnxpb.TensorProto_FLOAT8E5M2:
		return decodeMinifloat(b, 5, 2, 15, true)
	default: // E4M3FN: no infinities; S.1111.111 is NaN
		return decodeMinifloat(b, 4, 3, 7, false)
	}
}

// decodeMinifloat decodes sign, expBits exponent and manBits mantissa bits.
// ieee: the top exponent is Inf/NaN as in IEEE; otherwise only all-ones is NaN.
func decodeMinifloat(b uint8, expBits, manBits, bias int, ieee bool) float32 {
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	exp := int(b>>manBits) & (1<<expBits - 1)
	man := int(b) & (1<<manBits - 1)
	top := 1<<expBits - 1
	switch {
	case ieee && exp == top && man == 0:
		return float32(math.Inf(int(sign)))
	case ieee && exp == top, !ieee && exp == top && man == 1<<manBits-1:
		return float32(math.NaN())
	case exp == 0:
		return float32(sign * math.Ldexp(float64(man), 1-bias-manBits))
	default:
		return float32(sign * math.Ldexp(float64(man|1<<manBits), exp-bias-manBits))
	}
}

// toFloat32 decodes float data (f32, f16, bf16, f64, fp8) to float32.
func toFloat32(t dtype.DType, data []byte) []float32 {
	switch t {
	case onnxpb.TensorProto_FLOAT:
		out := make([]float32, len(data)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		return out
	case onnxpb.TensorProto_FLOAT16:
		out := make([]float32, len(data)/2)
		for i := range out {
			out[i] = float16.Frombits(binary.LittleEndian.Uint16(data[2*i:])).Float32()
		}
		return out
	case onnxpb.TensorProto_BFLOAT16:
		out := make([]float32, len(data)/2)
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(data[2*i:])) << 16)
		}
		return out
	case onnxpb.TensorProto_DOUBLE:
		out := make([]float32, len(data)/8)
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(data[8*i:])))
		}
		return out
	default: // one-byte codes: fp8, or exponents
		table := codeTable(t)
		out := make([]float32, len(data))
		for i, b := range data {
			out[i] = table[b]
		}
		return out
	}
}

// fromFloat32 encodes float32 values as t, rounding to nearest even as ONNX
// Runtime's Cast does.
func fromFloat32(t dtype.DType, v []float32) []byte {
	switch t {
	case onnxpb.TensorProto_FLOAT16:
		out := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(out[2*i:], float16.Fromfloat32(x).Bits())
		}
		return out
	case onnxpb.TensorProto_BFLOAT16:
		out := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(out[2*i:], bfloat16(x))
		}
		return out
	default:
		out := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		}
		return out
	}
}

// bfloat16 rounds x to bfloat16, nearest even; NaN stays NaN (quiet).
func bfloat16(x float32) uint16 {
	bits := math.Float32bits(x)
	if x != x {
		return uint16(bits>>16) | 0x40
	}
	bits += 0x7fff + (bits>>16)&1
	return uint16(bits >> 16)
}

// FP8Values is the float32 value of every byte of FP8 format t (E4M3FN,
// E5M2, E8M0), NaNs included: the table strata convert decodes with too.
func FP8Values(t dtype.DType) [256]float32 { return fp8Values(t) }

// FP4Values is the E2M1 code table (bit 3 is the sign).
func FP4Values() [16]float32 { return fp4Values }
