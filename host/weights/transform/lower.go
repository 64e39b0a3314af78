package transform

import (
	"encoding/binary"
	"math"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// GraphType is how a stored tensor's type appears in an opset-17 graph:
// FP8 as its bytes (opset 17 has no FP8 types; transforms decode them).
func GraphType(t dtype.DType) dtype.DType {
	if isFP8(t) {
		return onnxpb.TensorProto_UINT8
	}
	return t
}

// Graph is where Lower writes: the host's model under construction.
type Graph interface {
	// Leaf returns the value holding checkpoint tensor key as stored (an
	// FP8 tensor as UINT8: opset 17 has no FP8 types); stored is that
	// tensor when the leaf has it (Expr.Stored), else nil.
	Leaf(key string, stored *checkpoint.Tensor) (string, error)
	// Bytes returns a value holding checkpoint tensor key's bytes as UINT8
	// of shape (as many bytes): packed codes read without widening them.
	Bytes(key string, shape []int64) (string, error)
	// Node adds a default-domain node with one output and returns it.
	Node(op string, inputs []string, attrs ...*onnxpb.AttributeProto) string
}

// Lower writes e (after Infer) as ONNX nodes over the referenced tensors:
// the in-graph lowering. It returns the value holding the result.
func (e *Expr) Lower(g Graph) (string, error) {
	if e.IsLeaf() {
		return g.Leaf(e.Key, e.Stored)
	}
	switch e.Op { // these lower their arguments themselves
	case OpDequant, OpFP8:
		return lowering{g}.dequant(e)
	case OpUnpackInt:
		return lowering{g}.unpackInt(e)
	}
	args := make([]string, len(e.Args))
	for i, a := range e.Args {
		var err error
		if args[i], err = a.Lower(g); err != nil {
			return "", err
		}
	}
	l := lowering{g}
	switch e.Op {
	case OpCast:
		return l.cast(args[0], e.Args[0].Type.DType, e.Type.DType), nil
	case OpTranspose:
		return g.Node("Transpose", args, ints("perm", e.Ints...)), nil
	case OpReshape:
		return l.reshape(args[0], e.Type.Shape), nil
	case OpStack:
		return l.stack(e, args), nil
	case OpConcat:
		return g.Node("Concat", args, intAttr("axis", e.Axis)), nil
	case OpSlice:
		return g.Node("Slice", []string{args[0], l.int64s(e.Start), l.int64s(e.End), l.int64s(e.Axis), l.int64s(e.Step)}), nil
	case OpMXFP4:
		return l.mxfp4(e, args), nil
	case OpUnpackFP4:
		return l.unpackFP4(e, args[0]), nil
	default: // OpMul, OpDiv: checked by Infer
		return l.scalarArith(e, args), nil
	}
}

type lowering struct{ g Graph }

func (l lowering) const_(t *onnxpb.TensorProto) string {
	return l.g.Node("Constant", nil, &onnxpb.AttributeProto{Name: "value", Type: onnxpb.AttributeProto_TENSOR, T: t})
}

func (l lowering) int64s(v ...int64) string {
	raw := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(x))
	}
	return l.const_(&onnxpb.TensorProto{Dims: []int64{int64(len(v))}, DataType: int32(onnxpb.TensorProto_INT64), RawData: raw})
}

func (l lowering) int32Scalar(v int32) string {
	raw := binary.LittleEndian.AppendUint32(nil, uint32(v))
	return l.const_(&onnxpb.TensorProto{DataType: int32(onnxpb.TensorProto_INT32), RawData: raw})
}

func (l lowering) table(v []float32) string {
	raw := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
	}
	return l.const_(&onnxpb.TensorProto{Dims: []int64{int64(len(v))}, DataType: int32(onnxpb.TensorProto_FLOAT), RawData: raw})
}

// stack joins same-shaped values along a new axis. Before the last axis
// that is a Concat along the existing axis there and one Reshape splitting
// it: the same elements in the same order, in two nodes rather than an
// Unsqueeze per value (43,000 of GLM-4.6's 59,000 nodes were those).
func (l lowering) stack(e *Expr, args []string) string {
	if e.Axis < int64(len(e.Args[0].Type.Shape)) { // Infer made it non-negative
		return l.reshape(l.g.Node("Concat", args, intAttr("axis", e.Axis)), e.Type.Shape)
	}
	last := l.int64s(e.Axis)
	for i, a := range args {
		args[i] = l.g.Node("Unsqueeze", []string{a, last})
	}
	return l.g.Node("Concat", args, intAttr("axis", e.Axis))
}

func (l lowering) reshape(x string, shape []int64) string {
	return l.g.Node("Reshape", []string{x, l.int64s(shape...)})
}

// decode looks one-byte codes (FP8 formats, exponents) up in their float32
// table.
func (l lowering) decode(x string, t dtype.DType) string {
	table := codeTable(t)
	idx := l.g.Node("Cast", []string{x}, intAttr("to", int64(onnxpb.TensorProto_INT32)))
	return l.g.Node("Gather", []string{l.table(table[:]), idx}, intAttr("axis", 0))
}

// toFloat32 brings any float or one-byte code tensor to float32.
func (l lowering) toFloat32(x string, t dtype.DType) string {
	switch {
	case t == onnxpb.TensorProto_FLOAT:
		return x
	case isFloat(t):
		return l.g.Node("Cast", []string{x}, intAttr("to", int64(onnxpb.TensorProto_FLOAT)))
	default:
		return l.decode(x, t)
	}
}

func (l lowering) cast(x string, from, to dtype.DType) string {
	if from == to {
		return x
	}
	if isFP8(from) {
		x, from = l.decode(x, from), onnxpb.TensorProto_FLOAT
		if to == from {
			return x
		}
	}
	return l.g.Node("Cast", []string{x}, intAttr("to", int64(to)))
}

// mxfp4 decodes [..., G, 16] blocks: each byte's low nibble is the even
// column, its high nibble the odd one, times 2^(scale-127).
func (l lowering) mxfp4(e *Expr, args []string) string {
	blocks := e.Args[0].Type.Shape
	grouped := append(append([]int64{}, blocks[:len(blocks)-1]...), 32) // [..., G, 32]
	scale := l.g.Node("Unsqueeze", []string{l.decode(args[1], e.Args[1].Type.DType), l.int64s(-1)})
	return l.reshape(l.g.Node("Mul", []string{l.fp4Pairs(args[0], grouped), scale}), e.Type.Shape)
}

// fp4Pairs decodes both E2M1 nibbles of each byte, the low one first, into
// float32 of the given shape.
func (l lowering) fp4Pairs(x string, shape []int64) string {
	codes := l.g.Node("Cast", []string{x}, intAttr("to", int64(onnxpb.TensorProto_INT32)))
	sixteen := l.int32Scalar(16)
	fp4 := l.table(fp4Values[:])
	low := l.g.Node("Gather", []string{fp4, l.g.Node("Mod", []string{codes, sixteen})}, intAttr("axis", 0))
	high := l.g.Node("Gather", []string{fp4, l.g.Node("Div", []string{codes, sixteen})}, intAttr("axis", 0))
	last := l.int64s(-1)
	pairs := l.g.Node("Concat", []string{l.g.Node("Unsqueeze", []string{low, last}), l.g.Node("Unsqueeze", []string{high, last})}, intAttr("axis", -1))
	return l.reshape(pairs, shape)
}

func intAttr(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_INT, I: v}
}

func ints(name string, v ...int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_INTS, Ints: v}
}
