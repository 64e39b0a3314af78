// Package refeval is a small reference evaluator for ONNX FunctionProtos, so
// that SDK blocks can be unit-tested in Go against numbers. It is written to
// be read, not to be fast: every op is a plain loop over the output.
//
// Numerics: elementwise float math is float32 (transcendental functions are
// computed in float64 and rounded once); MatMul, reductions and Softmax
// accumulate in float64 and round once. A FLOAT16 or BFLOAT16 result is
// rounded to its type (round to nearest even) after every op that produces
// it, as a runtime holding the tensor in that type would.
package refeval

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/x448/float16"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// DType is an ONNX element type.
type DType = onnxpb.TensorProto_DataType

// Element types, for brevity.
const (
	Float32  = onnxpb.TensorProto_FLOAT
	Float16  = onnxpb.TensorProto_FLOAT16
	BFloat16 = onnxpb.TensorProto_BFLOAT16
	Int64    = onnxpb.TensorProto_INT64
	Int32    = onnxpb.TensorProto_INT32
	Bool     = onnxpb.TensorProto_BOOL
)

// Tensor is a dense row-major tensor. Float types (FLOAT, FLOAT16, BFLOAT16)
// keep their values in F (already rounded to the type), integer types in I,
// BOOL in B; the other two slices are nil.
type Tensor struct {
	DType DType
	Shape []int64
	F     []float32
	I     []int64
	B     []bool
}

// Floats is a float32 tensor of shape (nil: a scalar) holding vals.
func Floats(shape []int64, vals ...float32) Tensor {
	return Tensor{DType: Float32, Shape: shape, F: vals}
}

// FloatsOf is a tensor of float type dt holding vals rounded to dt.
func FloatsOf(dt DType, shape []int64, vals ...float32) Tensor {
	t := Tensor{DType: dt, Shape: shape, F: append([]float32(nil), vals...)}
	t.round()
	return t
}

// Ints is an int64 tensor of shape (nil: a scalar) holding vals.
func Ints(shape []int64, vals ...int64) Tensor {
	return Tensor{DType: Int64, Shape: shape, I: vals}
}

// Bools is a bool tensor of shape (nil: a scalar) holding vals.
func Bools(shape []int64, vals ...bool) Tensor {
	return Tensor{DType: Bool, Shape: shape, B: vals}
}

// Len is the number of elements.
func (t Tensor) Len() int { return numel(t.Shape) }

func numel(shape []int64) int {
	n := 1
	for _, d := range shape {
		n *= int(d)
	}
	return n
}

func isFloat(dt DType) bool { return dt == Float32 || dt == Float16 || dt == BFloat16 }

func isInt(dt DType) bool {
	switch dt {
	case onnxpb.TensorProto_INT8, onnxpb.TensorProto_INT16, Int32, Int64,
		onnxpb.TensorProto_UINT8, onnxpb.TensorProto_UINT16, onnxpb.TensorProto_UINT32, onnxpb.TensorProto_UINT64:
		return true
	}
	return false
}

func supported(dt DType) bool { return isFloat(dt) || isInt(dt) || dt == Bool }

// check verifies that the tensor's storage matches its dtype and shape.
func (t Tensor) check() error {
	n := t.Len()
	switch {
	case isFloat(t.DType):
		if len(t.F) != n || t.I != nil || t.B != nil {
			return fmt.Errorf("%s tensor of shape %v needs %d values in F (has F %d, I %d, B %d)", t.DType, t.Shape, n, len(t.F), len(t.I), len(t.B))
		}
	case isInt(t.DType):
		if len(t.I) != n || t.F != nil || t.B != nil {
			return fmt.Errorf("%s tensor of shape %v needs %d values in I (has F %d, I %d, B %d)", t.DType, t.Shape, n, len(t.F), len(t.I), len(t.B))
		}
	case t.DType == Bool:
		if len(t.B) != n || t.F != nil || t.I != nil {
			return fmt.Errorf("BOOL tensor of shape %v needs %d values in B (has F %d, I %d, B %d)", t.Shape, n, len(t.F), len(t.I), len(t.B))
		}
	default:
		return fmt.Errorf("element type %s is not supported", t.DType)
	}
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("negative dimension in shape %v", t.Shape)
		}
	}
	return nil
}

// round rounds float values to the tensor's float type.
func (t *Tensor) round() {
	switch t.DType {
	case Float16:
		for i, v := range t.F {
			t.F[i] = float16.Fromfloat32(v).Float32()
		}
	case BFloat16:
		for i, v := range t.F {
			t.F[i] = roundBF16(v)
		}
	}
}

// roundBF16 rounds to bfloat16, nearest even (NaN stays NaN).
func roundBF16(v float32) float32 {
	if v != v {
		return v
	}
	b := math.Float32bits(v)
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}

// alloc is a zero tensor of dtype and shape.
func alloc(dt DType, shape []int64) Tensor {
	t := Tensor{DType: dt, Shape: shape}
	n := numel(shape)
	switch {
	case isFloat(dt):
		t.F = make([]float32, n)
	case isInt(dt):
		t.I = make([]int64, n)
	default:
		t.B = make([]bool, n)
	}
	return t
}

// copyElem copies element j of src to element i of dst (same dtype).
func copyElem(dst Tensor, i int, src Tensor, j int) {
	switch {
	case dst.F != nil:
		dst.F[i] = src.F[j]
	case dst.I != nil:
		dst.I[i] = src.I[j]
	default:
		dst.B[i] = src.B[j]
	}
}

// float64At is element i as a number (bools are 0 or 1).
func (t Tensor) float64At(i int) float64 {
	switch {
	case t.F != nil:
		return float64(t.F[i])
	case t.I != nil:
		return float64(t.I[i])
	default:
		if t.B[i] {
			return 1
		}
		return 0
	}
}

// ints are the values of an integer tensor (shapes, axes, indices).
func (t Tensor) ints() ([]int64, error) {
	if !isInt(t.DType) {
		return nil, fmt.Errorf("want an integer tensor, got %s", t.DType)
	}
	return t.I, nil
}

// scalarFloat is the single value of a one-element tensor.
func (t Tensor) scalar() (float64, error) {
	if t.Len() != 1 {
		return 0, fmt.Errorf("want one value, got shape %v", t.Shape)
	}
	return t.float64At(0), nil
}

// strides of a row-major shape.
func strides(shape []int64) []int {
	s := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= int(shape[i])
	}
	return s
}

// unravel writes the coordinates of flat index i into idx.
func unravel(i int, shape []int64, idx []int) {
	for d := len(shape) - 1; d >= 0; d-- {
		n := int(shape[d])
		idx[d] = i % n
		i /= n
	}
}

// normAxis maps a possibly negative axis into [0, rank).
func normAxis(axis int64, rank int) (int, error) {
	if axis < -int64(rank) || axis >= int64(rank) {
		return 0, fmt.Errorf("axis %d out of range for rank %d", axis, rank)
	}
	if axis < 0 {
		axis += int64(rank)
	}
	return int(axis), nil
}

// FromProto decodes a TensorProto (raw_data or the typed fields).
func FromProto(p *onnxpb.TensorProto) (Tensor, error) {
	dt := DType(p.GetDataType())
	if !supported(dt) {
		return Tensor{}, fmt.Errorf("tensor %q: element type %s is not supported", p.GetName(), dt)
	}
	if p.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
		return Tensor{}, fmt.Errorf("tensor %q: external data is not supported", p.GetName())
	}
	shape := append([]int64{}, p.GetDims()...)
	t := alloc(dt, shape)
	n := t.Len()
	raw := p.GetRawData()
	if raw != nil {
		size := map[DType]int{Float32: 4, Float16: 2, BFloat16: 2, Bool: 1, Int64: 8, Int32: 4,
			onnxpb.TensorProto_INT8: 1, onnxpb.TensorProto_UINT8: 1, onnxpb.TensorProto_INT16: 2,
			onnxpb.TensorProto_UINT16: 2, onnxpb.TensorProto_UINT32: 4, onnxpb.TensorProto_UINT64: 8}[dt]
		if len(raw) != n*size {
			return Tensor{}, fmt.Errorf("tensor %q: %d raw bytes for %d %s values", p.GetName(), len(raw), n, dt)
		}
		for i := range n {
			b := raw[i*size:]
			switch dt {
			case Float32:
				t.F[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
			case Float16:
				t.F[i] = float16.Frombits(binary.LittleEndian.Uint16(b)).Float32()
			case BFloat16:
				t.F[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16)
			case Bool:
				t.B[i] = b[0] != 0
			case Int64, onnxpb.TensorProto_UINT64:
				t.I[i] = int64(binary.LittleEndian.Uint64(b))
			case Int32:
				t.I[i] = int64(int32(binary.LittleEndian.Uint32(b)))
			case onnxpb.TensorProto_UINT32:
				t.I[i] = int64(binary.LittleEndian.Uint32(b))
			case onnxpb.TensorProto_INT16:
				t.I[i] = int64(int16(binary.LittleEndian.Uint16(b)))
			case onnxpb.TensorProto_UINT16:
				t.I[i] = int64(binary.LittleEndian.Uint16(b))
			case onnxpb.TensorProto_INT8:
				t.I[i] = int64(int8(b[0]))
			case onnxpb.TensorProto_UINT8:
				t.I[i] = int64(b[0])
			}
		}
		return t, nil
	}
	var got int
	switch dt {
	case Float32:
		got = copy(t.F, p.GetFloatData())
	case Int64:
		got = copy(t.I, p.GetInt64Data())
	case onnxpb.TensorProto_UINT64, onnxpb.TensorProto_UINT32:
		for i, v := range p.GetUint64Data() {
			if i < n {
				t.I[i] = int64(v)
			}
		}
		got = len(p.GetUint64Data())
	default: // int32_data carries the 16-bit floats' bits, bools and small ints
		d := p.GetInt32Data()
		got = len(d)
		for i := 0; i < n && i < len(d); i++ {
			switch {
			case dt == Float16:
				t.F[i] = float16.Frombits(uint16(d[i])).Float32()
			case dt == BFloat16:
				t.F[i] = math.Float32frombits(uint32(uint16(d[i])) << 16)
			case dt == Bool:
				t.B[i] = d[i] != 0
			default:
				t.I[i] = int64(d[i])
			}
		}
	}
	if got != n {
		return Tensor{}, fmt.Errorf("tensor %q: %d values for shape %v", p.GetName(), got, shape)
	}
	return t, nil
}
