package convert

import (
	"encoding/binary"
	"math"
	"slices"

	"github.com/x448/float16"

	"github.com/strata-llm/strata/host/weights/transform"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Element codecs: safetensors float types to and from float32, and E4M3.
// Rounding is to nearest, ties to even, as torch's .to() does.

// isFloat reports whether a safetensors dtype is a plain float type that
// can be cast (not a quantised code).
func isFloat(dt string) bool {
	switch dt {
	case "F32", "F16", "BF16", "F64":
		return true
	}
	return false
}

// isFP8 reports whether dt is an FP8 weight type that needs a scale.
func isFP8(dt string) bool { return dt == "F8_E4M3" || dt == "F8_E5M2" }

// elemBytes is the size of one element of a byte-aligned dtype.
func elemBytes(dt string) int {
	switch dt {
	case "F64", "I64", "U64":
		return 8
	case "F32", "I32", "U32":
		return 4
	case "F16", "BF16", "I16", "U16":
		return 2
	}
	return 1
}

// decode appends the float32 values of src (dtype dt) to dst.
func decode(dst []float32, dt string, src []byte) []float32 {
	n := len(src) / elemBytes(dt)
	at := len(dst)
	dst = slices.Grow(dst, n)[:at+n]
	out := dst[at:]
	switch dt {
	case "F32":
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case "BF16":
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case "F16":
		for i := range out {
			out[i] = float16.Frombits(binary.LittleEndian.Uint16(src[2*i:])).Float32()
		}
	case "F64":
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	case "F8_E4M3":
		for i, b := range src {
			out[i] = e4m3Values[b]
		}
	case "F8_E5M2":
		for i, b := range src {
			out[i] = e5m2Values[b]
		}
	case "U8", "F8_E8M0": // exponent bytes, as MX scales are read
		for i, b := range src {
			out[i] = float32(math.Ldexp(1, int(b)-127))
		}
	default:
		return dst[:at]
	}
	return dst
}

// encode appends v as dtype dt (F32, F16, BF16 or F8_E4M3) to dst.
func encode(dst []byte, dt string, v []float32) []byte {
	switch dt {
	case "BF16":
		for _, x := range v {
			dst = binary.LittleEndian.AppendUint16(dst, bfloat16(x))
		}
	case "F16":
		for _, x := range v {
			dst = binary.LittleEndian.AppendUint16(dst, float16.Fromfloat32(x).Bits())
		}
	case "F8_E4M3":
		for _, x := range v {
			dst = append(dst, e4m3(x))
		}
	default:
		for _, x := range v {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
		}
	}
	return dst
}

// roundTo rounds x to the precision of dt (the value a reader decodes).
func roundTo(dt string, x float32) float32 {
	var b []byte
	b = encode(b, dt, []float32{x})
	return decode(nil, dt, b)[0]
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

// fp8Max is the largest finite E4M3FN value.
const fp8Max = 448

// e4m3 rounds x to E4M3FN (nearest even), saturating at ±448 as the
// quantisers clamp before casting; NaN maps to NaN. Normal values take the
// bit path (fastE4M3), the edges the plain definition.
func e4m3(x float32) uint8 {
	if code, ok := fastE4M3(math.Float32bits(x)); ok {
		return code
	}
	return e4m3Ref(x)
}

// e4m3Ref is the plain definition, for the edges (subnormals, saturation,
// NaN) and as the test's reference.
func e4m3Ref(x float32) uint8 {
	bits := math.Float32bits(x)
	sign := uint8(bits>>24) & 0x80
	a := math.Float32frombits(bits &^ (1 << 31))
	switch {
	case a != a:
		return sign | 0x7f
	case a >= fp8Max:
		return sign | 0x7e
	case a < 1.0/64: // below the smallest normal: subnormal steps of 2^-9
		return sign | uint8(math.RoundToEven(float64(a)*512))
	}
	b := math.Float32bits(a)
	exp := int(b>>23) - 127 + 7 // biased E4M3 exponent, 1..15
	man := b & 0x7fffff
	q := man >> 20
	rem := man & 0xfffff
	if rem > 0x80000 || rem == 0x80000 && q&1 == 1 {
		q++
	}
	if q == 8 {
		q = 0
		exp++
	}
	code := uint8(exp<<3) | uint8(q)
	if code > 0x7e {
		code = 0x7e
	}
	return sign | code
}

// absf is |x| without leaving float32.
func absf(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// The FP8 and E2M1 decode tables are the transform package's: a source
// dequantised here gives the bits --weights materialize gives.
var (
	e4m3Values = transform.FP8Values(onnxpb.TensorProto_FLOAT8E4M3FN)
	e5m2Values = transform.FP8Values(onnxpb.TensorProto_FLOAT8E5M2)
	fp4Values  = transform.FP4Values()
)
