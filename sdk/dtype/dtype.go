// Package dtype maps between the dtype names strata meets: safetensors header
// names (BF16, F8_E4M3, ...), ONNX TensorProto data types, and the names users
// and plugins write (float32, float16, ...).
package dtype

import (
	"fmt"
	"sort"
	"strings"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// DType is an ONNX tensor element type.
type DType = onnxpb.TensorProto_DataType

// Info describes one element type.
type Info struct {
	Safetensors string // name in a safetensors header; "" if it has none
	Name        string // user-facing name: float32, bfloat16, float8_e4m3fn, ...
	ONNX        DType
	Bits        int // bits per element (4 for packed FP4)
}

// All element types strata knows. The F8 and F4 rows are why strata parses
// safetensors headers itself: the Go safetensors library has no such dtypes.
var table = []Info{
	{"BOOL", "bool", onnxpb.TensorProto_BOOL, 8},
	{"U8", "uint8", onnxpb.TensorProto_UINT8, 8},
	{"I8", "int8", onnxpb.TensorProto_INT8, 8},
	{"U16", "uint16", onnxpb.TensorProto_UINT16, 16},
	{"I16", "int16", onnxpb.TensorProto_INT16, 16},
	{"F16", "float16", onnxpb.TensorProto_FLOAT16, 16},
	{"BF16", "bfloat16", onnxpb.TensorProto_BFLOAT16, 16},
	{"U32", "uint32", onnxpb.TensorProto_UINT32, 32},
	{"I32", "int32", onnxpb.TensorProto_INT32, 32},
	{"F32", "float32", onnxpb.TensorProto_FLOAT, 32},
	{"U64", "uint64", onnxpb.TensorProto_UINT64, 64},
	{"I64", "int64", onnxpb.TensorProto_INT64, 64},
	{"F64", "float64", onnxpb.TensorProto_DOUBLE, 64},
	{"F8_E4M3", "float8_e4m3fn", onnxpb.TensorProto_FLOAT8E4M3FN, 8},
	{"F8_E5M2", "float8_e5m2", onnxpb.TensorProto_FLOAT8E5M2, 8},
	{"F8_E8M0", "float8_e8m0", onnxpb.TensorProto_FLOAT8E8M0, 8},
	{"F4", "float4_e2m1", onnxpb.TensorProto_FLOAT4E2M1, 4},
}

// FromSafetensors looks up a safetensors header dtype name.
func FromSafetensors(name string) (Info, bool) {
	for _, d := range table {
		if d.Safetensors == name {
			return d, true
		}
	}
	return Info{}, false
}

// Of looks up an ONNX element type.
func Of(t DType) (Info, bool) {
	for _, d := range table {
		if d.ONNX == t {
			return d, true
		}
	}
	return Info{}, false
}

// Name is the user-facing name of an ONNX element type.
func Name(t DType) string {
	if d, ok := Of(t); ok {
		return d.Name
	}
	return t.String()
}

// Compute dtypes a graph may compute in.
var computeNames = map[string]DType{
	"float32": onnxpb.TensorProto_FLOAT,
	"float16": onnxpb.TensorProto_FLOAT16,
}

// ParseCompute parses a compute dtype name ("" means float32).
func ParseCompute(name string) (DType, error) {
	if name == "" {
		return onnxpb.TensorProto_FLOAT, nil
	}
	if t, ok := computeNames[name]; ok {
		return t, nil
	}
	names := make([]string, 0, len(computeNames))
	for n := range computeNames {
		names = append(names, n)
	}
	sort.Strings(names)
	return 0, fmt.Errorf("unknown compute dtype %q: use one of %s", name, strings.Join(names, ", "))
}

// Parse parses any user-facing element type name.
func Parse(name string) (DType, error) {
	for _, d := range table {
		if d.Name == name {
			return d.ONNX, nil
		}
	}
	return 0, fmt.Errorf("unknown dtype %q", name)
}

// ByteSize is the number of bytes n elements take, rounding packed
// sub-byte types up to whole bytes.
func (i Info) ByteSize(n int64) int64 {
	return (n*int64(i.Bits) + 7) / 8
}
