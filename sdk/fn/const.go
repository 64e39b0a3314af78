package fn

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/x448/float16"

	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// DType is an ONNX element type.
type DType = dtype.DType

// Element types used by the blocks.
const (
	Float32 = onnxpb.TensorProto_FLOAT
	Float16 = onnxpb.TensorProto_FLOAT16
	Int64   = onnxpb.TensorProto_INT64
	Int32   = onnxpb.TensorProto_INT32
	Bool    = onnxpb.TensorProto_BOOL
)

// AttrInt is an integer attribute.
func AttrInt(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_INT, I: v}
}

// AttrInts is an integer-list attribute.
func AttrInts(name string, v ...int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_INTS, Ints: v}
}

// AttrFloat is a float attribute.
func AttrFloat(name string, v float32) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_FLOAT, F: v}
}

// AttrString is a string attribute.
func AttrString(name, v string) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_STRING, S: []byte(v)}
}

// AttrTensor is a tensor attribute.
func AttrTensor(name string, t *onnxpb.TensorProto) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_TENSOR, T: t}
}

// AttrRef refers, inside a function body, to the function's attribute ref.
func AttrRef(name string, typ onnxpb.AttributeProto_AttributeType, ref string) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: typ, RefAttrName: ref}
}

// Int64Tensor is a constant int64 tensor of the given dims (nil dims: 1-D).
func Int64Tensor(dims []int64, v ...int64) *onnxpb.TensorProto {
	if dims == nil {
		dims = []int64{int64(len(v))}
	}
	raw := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(x))
	}
	return &onnxpb.TensorProto{Dims: dims, DataType: int32(Int64), RawData: raw}
}

// FloatTensor is a constant float tensor in dtype t (float32, float16 or
// bfloat16) of the given dims (nil dims: 1-D).
func FloatTensor(t DType, dims []int64, v ...float32) (*onnxpb.TensorProto, error) {
	if dims == nil {
		dims = []int64{int64(len(v))}
	}
	var raw []byte
	switch t {
	case onnxpb.TensorProto_FLOAT:
		raw = make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
		}
	case onnxpb.TensorProto_FLOAT16:
		raw = make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(raw[2*i:], float16.Fromfloat32(x).Bits())
		}
	default:
		return nil, fmt.Errorf("float constant of dtype %s not supported", dtype.Name(t))
	}
	return &onnxpb.TensorProto{Dims: dims, DataType: int32(t), RawData: raw}, nil
}

// Const adds a Constant node holding t.
func (f *Func) Const(t *onnxpb.TensorProto) Value {
	return f.Op("Constant", nil, AttrTensor("value", t))
}

// Ints is a 1-D int64 constant.
func (f *Func) Ints(v ...int64) Value {
	return f.intConst(fmt.Sprint("ints", v), Int64Tensor(nil, v...))
}

// Int is a scalar int64 constant.
func (f *Func) Int(v int64) Value {
	return f.intConst(fmt.Sprint("int", v), Int64Tensor([]int64{}, v))
}

// intConst reuses one Constant node per distinct integer constant: shapes,
// axes and indices repeat all over a layer.
func (f *Func) intConst(key string, t *onnxpb.TensorProto) Value {
	if v, ok := f.consts[key]; ok {
		return v
	}
	v := (&Func{state: f.state, scope: "const"}).Const(t)
	f.consts[key] = v
	return v
}

// Scalar is a scalar constant in the compute dtype.
func (f *Func) Scalar(v float32) Value {
	return f.ScalarOf(f.dtype, v)
}

// ScalarOf is a scalar float constant of dtype t.
func (f *Func) ScalarOf(t DType, v float32) Value {
	tensor, err := FloatTensor(t, []int64{}, v)
	if err != nil {
		panic(err) // the compute dtype was validated when the builder was made
	}
	return f.Const(tensor)
}

// Floats is a 1-D float32 constant.
func (f *Func) Floats(v ...float32) Value {
	tensor, _ := FloatTensor(Float32, nil, v...)
	return f.Const(tensor)
}

// MustFloatTensor is FloatTensor for a one-element [1] tensor in a dtype the
// caller knows is a float dtype; it panics otherwise.
func MustFloatTensor(t DType, v float32) *onnxpb.TensorProto {
	tensor, err := FloatTensor(t, []int64{1}, v)
	if err != nil {
		panic(err)
	}
	return tensor
}
