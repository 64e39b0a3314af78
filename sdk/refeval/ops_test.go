package refeval

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

func aInt(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_INT, I: v}
}

func aFloat(name string, v float32) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_FLOAT, F: v}
}

func aInts(name string, v ...int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_INTS, Ints: v}
}

func aStr(name, v string) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_STRING, S: []byte(v)}
}

// runOp evaluates one node of op on inputs (a nil entry is an omitted
// optional input) with nOut outputs.
func runOp(op string, inputs []*Tensor, nOut int, attrs ...*onnxpb.AttributeProto) ([]Tensor, error) {
	fn := &onnxpb.FunctionProto{Domain: "test", Name: op}
	nd := &onnxpb.NodeProto{OpType: op, Name: "n", Attribute: attrs}
	in := map[string]Tensor{}
	for i, t := range inputs {
		if t == nil {
			nd.Input = append(nd.Input, "")
			continue
		}
		name := fmt.Sprintf("x%d", i)
		fn.Input = append(fn.Input, name)
		nd.Input = append(nd.Input, name)
		in[name] = *t
	}
	for i := range nOut {
		name := fmt.Sprintf("y%d", i)
		fn.Output = append(fn.Output, name)
		nd.Output = append(nd.Output, name)
	}
	fn.Node = []*onnxpb.NodeProto{nd}
	res, err := Run(fn, nil, in)
	if err != nil {
		return nil, err
	}
	outs := make([]Tensor, nOut)
	for i := range outs {
		outs[i] = res[fmt.Sprintf("y%d", i)]
	}
	return outs, nil
}

func p(t Tensor) *Tensor { return &t }

func f32(shape []int64, v ...float32) *Tensor { return p(Floats(shape, v...)) }
func i64(shape []int64, v ...int64) *Tensor   { return p(Ints(shape, v...)) }
func bools(shape []int64, v ...bool) *Tensor  { return p(Bools(shape, v...)) }
func sh(d ...int64) []int64                   { return d }

var scalar = []int64{}

func equalTensor(a, b Tensor) bool {
	if a.DType != b.DType || !equalShape(a.Shape, b.Shape) {
		return false
	}
	if len(a.F) != len(b.F) || len(a.I) != len(b.I) || len(a.B) != len(b.B) {
		return false
	}
	for i := range a.F {
		x, y := a.F[i], b.F[i]
		if !(x == y || (x != x && y != y) || math.Abs(float64(x-y)) <= 1e-6*math.Max(1, math.Abs(float64(y)))) {
			return false
		}
	}
	return slices.Equal(a.I, b.I) && slices.Equal(a.B, b.B)
}

func TestOps(t *testing.T) {
	inf := float32(math.Inf(1))
	cases := []struct {
		name  string
		op    string
		in    []*Tensor
		attrs []*onnxpb.AttributeProto
		want  []Tensor
	}{
		{"add broadcast", "Add", []*Tensor{f32(sh(2, 1), 1, 2), f32(sh(3), 10, 20, 30)}, nil,
			[]Tensor{Floats(sh(2, 3), 11, 21, 31, 12, 22, 32)}},
		{"add int", "Add", []*Tensor{i64(sh(2), 1, 2), i64(scalar, 5)}, nil, []Tensor{Ints(sh(2), 6, 7)}},
		{"sub", "Sub", []*Tensor{f32(sh(2), 1, 2), f32(scalar, 0.5)}, nil, []Tensor{Floats(sh(2), 0.5, 1.5)}},
		{"mul", "Mul", []*Tensor{f32(sh(1, 2), 2, 3), f32(sh(2, 1), 4, 5)}, nil, []Tensor{Floats(sh(2, 2), 8, 12, 10, 15)}},
		{"div float", "Div", []*Tensor{f32(sh(2), 1, -3), f32(scalar, 2)}, nil, []Tensor{Floats(sh(2), 0.5, -1.5)}},
		{"div int truncates", "Div", []*Tensor{i64(sh(2), 7, -7), i64(scalar, 2)}, nil, []Tensor{Ints(sh(2), 3, -3)}},
		{"pow", "Pow", []*Tensor{f32(sh(3), 2, 3, 4), f32(scalar, 2)}, nil, []Tensor{Floats(sh(3), 4, 9, 16)}},
		{"pow int exponent", "Pow", []*Tensor{f32(sh(2), 2, 0.5), i64(scalar, 3)}, nil, []Tensor{Floats(sh(2), 8, 0.125)}},
		{"mod int sign of divisor", "Mod", []*Tensor{i64(sh(4), 7, -7, 7, -7), i64(sh(4), 3, 3, -3, -3)}, nil, []Tensor{Ints(sh(4), 1, 2, -2, -1)}},
		{"mod fmod", "Mod", []*Tensor{f32(sh(2), 7.5, -7.5), f32(scalar, 2)}, []*onnxpb.AttributeProto{aInt("fmod", 1)}, []Tensor{Floats(sh(2), 1.5, -1.5)}},
		{"max variadic", "Max", []*Tensor{f32(sh(3), 1, 5, 3), f32(scalar, 2), f32(sh(3), 0, 0, 4)}, nil, []Tensor{Floats(sh(3), 2, 5, 4)}},
		{"min", "Min", []*Tensor{f32(sh(3), 1, 5, 3), f32(scalar, 2)}, nil, []Tensor{Floats(sh(3), 1, 2, 2)}},
		{"min int", "Min", []*Tensor{i64(sh(2), 1, 5), i64(scalar, 2)}, nil, []Tensor{Ints(sh(2), 1, 2)}},
		{"sum", "Sum", []*Tensor{f32(sh(2), 1, 2), f32(sh(2), 3, 4), f32(scalar, 10)}, nil, []Tensor{Floats(sh(2), 14, 16)}},
		{"equal", "Equal", []*Tensor{i64(sh(3), 1, 2, 3), i64(scalar, 2)}, nil, []Tensor{Bools(sh(3), false, true, false)}},
		{"less", "Less", []*Tensor{f32(sh(3), 1, 2, 3), f32(scalar, 2)}, nil, []Tensor{Bools(sh(3), true, false, false)}},
		{"greater", "Greater", []*Tensor{i64(sh(1, 3), 0, 1, 2), i64(sh(2, 1), 0, 1)}, nil, []Tensor{Bools(sh(2, 3), false, true, true, false, false, true)}},
		{"and", "And", []*Tensor{bools(sh(4), true, true, false, false), bools(sh(4), true, false, true, false)}, nil, []Tensor{Bools(sh(4), true, false, false, false)}},
		{"or", "Or", []*Tensor{bools(sh(2), true, false), bools(scalar, false)}, nil, []Tensor{Bools(sh(2), true, false)}},
		{"xor", "Xor", []*Tensor{bools(sh(2), true, true), bools(sh(2), true, false)}, nil, []Tensor{Bools(sh(2), false, true)}},
		{"less or equal", "LessOrEqual", []*Tensor{i64(sh(3), 1, 2, 3), i64(scalar, 2)}, nil, []Tensor{Bools(sh(3), true, true, false)}},
		{"greater or equal", "GreaterOrEqual", []*Tensor{f32(sh(3), 1, 2, 3), f32(scalar, 2)}, nil, []Tensor{Bools(sh(3), false, true, true)}},
		{"abs", "Abs", []*Tensor{f32(sh(2), -1.5, 2)}, nil, []Tensor{Floats(sh(2), 1.5, 2)}},
		{"log", "Log", []*Tensor{f32(sh(2), 1, float32(math.E))}, nil, []Tensor{Floats(sh(2), 0, 1)}},
		{"ceil", "Ceil", []*Tensor{f32(sh(2), 1.5, -1.5)}, nil, []Tensor{Floats(sh(2), 2, -1)}},
		{"not", "Not", []*Tensor{bools(sh(2), true, false)}, nil, []Tensor{Bools(sh(2), false, true)}},
		{"neg", "Neg", []*Tensor{f32(sh(2), 1, -2)}, nil, []Tensor{Floats(sh(2), -1, 2)}},
		{"neg int", "Neg", []*Tensor{i64(sh(2), 1, -2)}, nil, []Tensor{Ints(sh(2), -1, 2)}},
		{"sqrt", "Sqrt", []*Tensor{f32(sh(2), 4, 2)}, nil, []Tensor{Floats(sh(2), 2, float32(math.Sqrt2))}},
		{"reciprocal", "Reciprocal", []*Tensor{f32(sh(2), 4, -0.5)}, nil, []Tensor{Floats(sh(2), 0.25, -2)}},
		{"exp", "Exp", []*Tensor{f32(sh(2), 0, 1)}, nil, []Tensor{Floats(sh(2), 1, float32(math.E))}},
		{"sigmoid", "Sigmoid", []*Tensor{f32(sh(3), 0, 2, -100)}, nil, []Tensor{Floats(sh(3), 0.5, 0.8807970779778823, 3.7200759760208356e-44)}},
		{"tanh", "Tanh", []*Tensor{f32(sh(2), 0, 1)}, nil, []Tensor{Floats(sh(2), 0, 0.7615941559557649)}},
		{"erf", "Erf", []*Tensor{f32(sh(2), 0, 1)}, nil, []Tensor{Floats(sh(2), 0, 0.8427007929497149)}},
		{"cos sin", "Cos", []*Tensor{f32(sh(2), 0, math.Pi)}, nil, []Tensor{Floats(sh(2), 1, -1)}},
		{"sin", "Sin", []*Tensor{f32(sh(2), 0, math.Pi/2)}, nil, []Tensor{Floats(sh(2), 0, 1)}},
		{"floor", "Floor", []*Tensor{f32(sh(3), 1.5, -1.5, 2)}, nil, []Tensor{Floats(sh(3), 1, -2, 2)}},
		{"where", "Where", []*Tensor{bools(sh(2, 1), true, false), f32(sh(2), 1, 2), f32(scalar, -1)}, nil,
			[]Tensor{Floats(sh(2, 2), 1, 2, -1, -1)}},
		{"clip", "Clip", []*Tensor{f32(sh(4), -9, -1, 1, 9), f32(scalar, -7), f32(scalar, 7)}, nil, []Tensor{Floats(sh(4), -7, -1, 1, 7)}},
		{"clip max only", "Clip", []*Tensor{f32(sh(3), -9, 1, inf), nil, f32(scalar, 7)}, nil, []Tensor{Floats(sh(3), -9, 1, 7)}},

		{"identity", "Identity", []*Tensor{i64(sh(2), 1, 2)}, nil, []Tensor{Ints(sh(2), 1, 2)}},
		{"shape", "Shape", []*Tensor{f32(sh(2, 3, 4), make([]float32, 24)...)}, nil, []Tensor{Ints(sh(3), 2, 3, 4)}},
		{"shape start end", "Shape", []*Tensor{f32(sh(2, 3, 4), make([]float32, 24)...)}, []*onnxpb.AttributeProto{aInt("start", 1), aInt("end", -1)}, []Tensor{Ints(sh(1), 3)}},
		{"shape end", "Shape", []*Tensor{f32(sh(2, 3, 4), make([]float32, 24)...)}, []*onnxpb.AttributeProto{aInt("end", 2)}, []Tensor{Ints(sh(2), 2, 3)}},
		{"reshape 0 and -1", "Reshape", []*Tensor{f32(sh(2, 3, 2), seq(12)...), i64(sh(3), 0, -1, 2)}, nil, []Tensor{Floats(sh(2, 3, 2), seq(12)...)}},
		{"reshape flat", "Reshape", []*Tensor{f32(sh(2, 3), seq(6)...), i64(sh(1), -1)}, nil, []Tensor{Floats(sh(6), seq(6)...)}},
		{"transpose", "Transpose", []*Tensor{f32(sh(2, 3), 0, 1, 2, 3, 4, 5)}, []*onnxpb.AttributeProto{aInts("perm", 1, 0)}, []Tensor{Floats(sh(3, 2), 0, 3, 1, 4, 2, 5)}},
		{"transpose 3d", "Transpose", []*Tensor{f32(sh(2, 2, 2), seq(8)...)}, []*onnxpb.AttributeProto{aInts("perm", 0, 2, 1)}, []Tensor{Floats(sh(2, 2, 2), 0, 2, 1, 3, 4, 6, 5, 7)}},
		{"transpose default", "Transpose", []*Tensor{i64(sh(1, 2), 1, 2)}, nil, []Tensor{Ints(sh(2, 1), 1, 2)}},
		{"unsqueeze", "Unsqueeze", []*Tensor{f32(sh(2), 1, 2), i64(sh(2), 0, -1)}, nil, []Tensor{Floats(sh(1, 2, 1), 1, 2)}},
		{"unsqueeze scalar", "Unsqueeze", []*Tensor{i64(scalar, 4), i64(sh(1), 0)}, nil, []Tensor{Ints(sh(1), 4)}},
		{"squeeze axes", "Squeeze", []*Tensor{f32(sh(1, 2, 1), 1, 2), i64(sh(1), 2)}, nil, []Tensor{Floats(sh(1, 2), 1, 2)}},
		{"squeeze all", "Squeeze", []*Tensor{f32(sh(1, 2, 1), 1, 2)}, nil, []Tensor{Floats(sh(2), 1, 2)}},
		{"concat", "Concat", []*Tensor{f32(sh(2, 1), 1, 2), f32(sh(2, 2), 3, 4, 5, 6)}, []*onnxpb.AttributeProto{aInt("axis", -1)}, []Tensor{Floats(sh(2, 3), 1, 3, 4, 2, 5, 6)}},
		{"concat ints axis 0", "Concat", []*Tensor{i64(sh(1), 1), i64(sh(2), 2, 3)}, []*onnxpb.AttributeProto{aInt("axis", 0)}, []Tensor{Ints(sh(3), 1, 2, 3)}},
		{"slice", "Slice", []*Tensor{f32(sh(2, 4), seq(8)...), i64(sh(2), 0, 1), i64(sh(2), 1, 100)}, nil, []Tensor{Floats(sh(1, 3), 1, 2, 3)}},
		{"slice axes steps", "Slice", []*Tensor{f32(sh(2, 4), seq(8)...), i64(sh(1), 1), i64(sh(1), 4), i64(sh(1), -1), i64(sh(1), 2)}, nil, []Tensor{Floats(sh(2, 2), 1, 3, 5, 7)}},
		{"slice negative step", "Slice", []*Tensor{f32(sh(4), seq(4)...), i64(sh(1), -1), i64(sh(1), math.MinInt64), i64(sh(1), 0), i64(sh(1), -1)}, nil, []Tensor{Floats(sh(4), 3, 2, 1, 0)}},
		{"expand", "Expand", []*Tensor{f32(sh(2, 1), 1, 2), i64(sh(3), 2, 1, 3)}, nil, []Tensor{Floats(sh(2, 2, 3), 1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2)}},
		{"expand smaller shape", "Expand", []*Tensor{f32(sh(2, 2), 1, 2, 3, 4), i64(sh(1), 1)}, nil, []Tensor{Floats(sh(2, 2), 1, 2, 3, 4)}},
		{"tile", "Tile", []*Tensor{f32(sh(1, 2), 1, 2), i64(sh(2), 2, 2)}, nil, []Tensor{Floats(sh(2, 4), 1, 2, 1, 2, 1, 2, 1, 2)}},
		{"constant of shape", "ConstantOfShape", []*Tensor{i64(sh(2), 2, 1)}, nil, []Tensor{Floats(sh(2, 1), 0, 0)}},
		{"range int", "Range", []*Tensor{i64(scalar, 0), i64(scalar, 5), i64(scalar, 2)}, nil, []Tensor{Ints(sh(3), 0, 2, 4)}},
		{"range float", "Range", []*Tensor{f32(scalar, 1), f32(scalar, 0), f32(scalar, -0.5)}, nil, []Tensor{Floats(sh(2), 1, 0.5)}},
		{"range empty", "Range", []*Tensor{i64(scalar, 3), i64(scalar, 1), i64(scalar, 1)}, nil, []Tensor{Ints(sh(0))}},
		{"cast float to int", "Cast", []*Tensor{f32(sh(3), 1.7, -1.7, 0)}, []*onnxpb.AttributeProto{aInt("to", int64(Int64))}, []Tensor{Ints(sh(3), 1, -1, 0)}},
		{"cast int to float16", "Cast", []*Tensor{i64(sh(2), 2049, 3)}, []*onnxpb.AttributeProto{aInt("to", int64(Float16))}, []Tensor{FloatsOf(Float16, sh(2), 2048, 3)}},
		{"cast to bool", "Cast", []*Tensor{f32(sh(2), 0, -2)}, []*onnxpb.AttributeProto{aInt("to", int64(Bool))}, []Tensor{Bools(sh(2), false, true)}},
		{"cast bool to float", "Cast", []*Tensor{bools(sh(2), true, false)}, []*onnxpb.AttributeProto{aInt("to", int64(Float32))}, []Tensor{Floats(sh(2), 1, 0)}},
		{"cast to bfloat16", "Cast", []*Tensor{f32(sh(2), 1.00390625, 1.01171875)}, []*onnxpb.AttributeProto{aInt("to", int64(BFloat16))}, []Tensor{FloatsOf(BFloat16, sh(2), 1, 1.015625)}},
		{"castlike", "CastLike", []*Tensor{i64(sh(1), 3), f32(scalar, 0)}, nil, []Tensor{Floats(sh(1), 3)}},

		{"gather axis 0", "Gather", []*Tensor{f32(sh(3, 2), seq(6)...), i64(sh(2), 2, -3)}, []*onnxpb.AttributeProto{aInt("axis", 0)}, []Tensor{Floats(sh(2, 2), 4, 5, 0, 1)}},
		{"gather scalar index", "Gather", []*Tensor{i64(sh(3), 7, 8, 9), i64(scalar, 1)}, nil, []Tensor{Ints(scalar, 8)}},
		{"gather axis 1", "Gather", []*Tensor{f32(sh(2, 3), seq(6)...), i64(sh(1, 2), 2, 0)}, []*onnxpb.AttributeProto{aInt("axis", 1)}, []Tensor{Floats(sh(2, 1, 2), 2, 0, 5, 3)}},
		{"gather elements", "GatherElements", []*Tensor{f32(sh(2, 3), seq(6)...), i64(sh(2, 2), 2, 0, 1, 1)}, []*onnxpb.AttributeProto{aInt("axis", 1)}, []Tensor{Floats(sh(2, 2), 2, 0, 4, 4)}},
		{"gathernd", "GatherND", []*Tensor{f32(sh(2, 2), 0, 1, 2, 3), i64(sh(2, 2), 0, 0, 1, 1)}, nil, []Tensor{Floats(sh(2), 0, 3)}},
		{"gathernd slices", "GatherND", []*Tensor{f32(sh(2, 2), 0, 1, 2, 3), i64(sh(2, 1), 1, 0)}, nil, []Tensor{Floats(sh(2, 2), 2, 3, 0, 1)}},
		{"gathernd batch_dims 1", "GatherND", []*Tensor{f32(sh(2, 3, 2), seq(12)...), i64(sh(2, 1, 1), 2, 0)}, []*onnxpb.AttributeProto{aInt("batch_dims", 1)},
			[]Tensor{Floats(sh(2, 1, 2), 4, 5, 6, 7)}},
		{"scatternd", "ScatterND", []*Tensor{f32(sh(4), 1, 2, 3, 4), i64(sh(2, 1), 3, 1), f32(sh(2), 9, 10)}, nil, []Tensor{Floats(sh(4), 1, 10, 3, 9)}},
		{"scatternd slices", "ScatterND", []*Tensor{f32(sh(2, 2), 0, 0, 0, 0), i64(sh(1, 1), 1), f32(sh(1, 2), 5, 6)}, nil, []Tensor{Floats(sh(2, 2), 0, 0, 5, 6)}},
		{"scatternd add", "ScatterND", []*Tensor{f32(sh(3), 1, 1, 1), i64(sh(2, 1), 0, 0), f32(sh(2), 2, 3)}, []*onnxpb.AttributeProto{aStr("reduction", "add")}, []Tensor{Floats(sh(3), 6, 1, 1)}},
		{"scatter elements", "ScatterElements", []*Tensor{f32(sh(2, 3), make([]float32, 6)...), i64(sh(2, 1), 2, 0), f32(sh(2, 1), 7, 8)}, []*onnxpb.AttributeProto{aInt("axis", 1)},
			[]Tensor{Floats(sh(2, 3), 0, 0, 7, 8, 0, 0)}},

		{"reduce sum input axes", "ReduceSum", []*Tensor{f32(sh(2, 3), seq(6)...), i64(sh(1), 1)}, []*onnxpb.AttributeProto{aInt("keepdims", 0)}, []Tensor{Floats(sh(2), 3, 12)}},
		{"cumsum int", "CumSum", []*Tensor{i64(sh(2, 3), 1, 0, 1, 1, 1, 0), i64(scalar, 1)}, nil, []Tensor{Ints(sh(2, 3), 1, 1, 2, 1, 2, 2)}},
		{"cumsum float axis 0", "CumSum", []*Tensor{f32(sh(2, 2), 1, 2, 3, 4), i64(sh(1), 0)}, nil, []Tensor{Floats(sh(2, 2), 1, 2, 4, 6)}},
		{"reduce sum all", "ReduceSum", []*Tensor{f32(sh(2, 3), seq(6)...)}, nil, []Tensor{Floats(sh(1, 1), 15)}},
		{"reduce mean attr axes", "ReduceMean", []*Tensor{f32(sh(2, 3), seq(6)...)}, []*onnxpb.AttributeProto{aInts("axes", -1)}, []Tensor{Floats(sh(2, 1), 1, 4)}},
		{"reduce max axis 0", "ReduceMax", []*Tensor{i64(sh(2, 2), 1, 7, 3, 2)}, []*onnxpb.AttributeProto{aInts("axes", 0), aInt("keepdims", 0)}, []Tensor{Ints(sh(2), 3, 7)}},
		{"reduce min", "ReduceMin", []*Tensor{f32(sh(2, 2), 1, 7, 3, -2)}, []*onnxpb.AttributeProto{aInts("axes", 1), aInt("keepdims", 0)}, []Tensor{Floats(sh(2), 1, -2)}},
		{"argmin", "ArgMin", []*Tensor{f32(sh(4), 3, 1, 1, 2)}, []*onnxpb.AttributeProto{aInt("axis", 0), aInt("keepdims", 0)}, []Tensor{Ints(scalar, 1)}},
		{"argmax last of ties", "ArgMax", []*Tensor{f32(sh(3), 5, 1, 5)}, []*onnxpb.AttributeProto{aInt("select_last_index", 1)}, []Tensor{Ints(sh(1), 2)}},
		{"argmax first of ties", "ArgMax", []*Tensor{f32(sh(2, 3), 1, 3, 3, 5, 0, 5)}, []*onnxpb.AttributeProto{aInt("axis", 1), aInt("keepdims", 1)}, []Tensor{Ints(sh(2, 1), 1, 0)}},
		{"argmax int", "ArgMax", []*Tensor{i64(sh(1, 3), -1, 4, 2)}, []*onnxpb.AttributeProto{aInt("axis", 1), aInt("keepdims", 0)}, []Tensor{Ints(sh(1), 1)}},
		{"softmax", "Softmax", []*Tensor{f32(sh(2, 2), 0, 0, 0, float32(math.Log(3)))}, []*onnxpb.AttributeProto{aInt("axis", -1)}, []Tensor{Floats(sh(2, 2), 0.5, 0.5, 0.25, 0.75)}},
		{"softmax axis 0", "Softmax", []*Tensor{f32(sh(2, 1), 0, 0)}, []*onnxpb.AttributeProto{aInt("axis", 0)}, []Tensor{Floats(sh(2, 1), 0.5, 0.5)}},
		{"softmax masked", "Softmax", []*Tensor{f32(sh(3), 1, -65504, float32(math.Inf(-1)))}, nil, []Tensor{Floats(sh(3), 1, 0, 0)}},
		{"matmul", "MatMul", []*Tensor{f32(sh(2, 2), 1, 2, 3, 4), f32(sh(2, 1), 5, 6)}, nil, []Tensor{Floats(sh(2, 1), 17, 39)}},
		{"matmul batched broadcast", "MatMul", []*Tensor{f32(sh(2, 1, 1, 2), 1, 2, 3, 4), f32(sh(3, 2, 1), 1, 0, 0, 1, 1, 1)}, nil,
			[]Tensor{Floats(sh(2, 3, 1, 1), 1, 2, 3, 3, 4, 7)}},
		{"matmul vector", "MatMul", []*Tensor{f32(sh(2), 1, 2), f32(sh(2, 3), 1, 2, 3, 4, 5, 6)}, nil, []Tensor{Floats(sh(3), 9, 12, 15)}},
		// Gemm as a Linear uses it: x [2,2] · Wᵀ for W [3,2] (out, in), bias [3].
		{"gemm transB with bias", "Gemm", []*Tensor{f32(sh(2, 2), 1, 2, 3, 4), f32(sh(3, 2), 1, 0, 0, 1, 1, 1), f32(sh(3), 10, 20, 30)},
			[]*onnxpb.AttributeProto{aInt("transB", 1)}, []Tensor{Floats(sh(2, 3), 11, 22, 33, 13, 24, 37)}},
		{"gemm transA alpha beta", "Gemm", []*Tensor{f32(sh(2, 1), 1, 2), f32(sh(2, 2), 1, 2, 3, 4), f32(sh(1), 1)},
			[]*onnxpb.AttributeProto{aInt("transA", 1), aFloat("alpha", 2), aFloat("beta", 3)}, []Tensor{Floats(sh(1, 2), 17, 23)}},
		{"flatten last axis", "Flatten", []*Tensor{f32(sh(2, 3, 2), seq(12)...)}, []*onnxpb.AttributeProto{aInt("axis", -1)},
			[]Tensor{Floats(sh(6, 2), seq(12)...)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := runOp(tc.op, tc.in, len(tc.want), tc.attrs...)
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.want {
				if !equalTensor(got[i], tc.want[i]) {
					t.Errorf("output %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func seq(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(i)
	}
	return v
}

func TestTopK(t *testing.T) {
	x := Floats(sh(2, 4), 1, 3, 3, 2, 5, 5, 5, 0)
	got, err := runOp("TopK", []*Tensor{&x, i64(sh(1), 3)}, 2, aInt("axis", -1), aInt("largest", 1), aInt("sorted", 1))
	if err != nil {
		t.Fatal(err)
	}
	if want := Floats(sh(2, 3), 3, 3, 2, 5, 5, 5); !equalTensor(got[0], want) {
		t.Errorf("values %v, want %v", got[0], want)
	}
	if want := Ints(sh(2, 3), 1, 2, 3, 0, 1, 2); !equalTensor(got[1], want) {
		t.Errorf("indices %v, want %v (ties: lower index first)", got[1], want)
	}
	got, err = runOp("TopK", []*Tensor{&x, i64(sh(1), 2)}, 2, aInt("axis", 0), aInt("largest", 0))
	if err != nil {
		t.Fatal(err)
	}
	if want := Ints(sh(2, 4), 0, 0, 0, 1, 1, 1, 1, 0); !equalTensor(got[1], want) {
		t.Errorf("smallest along axis 0: indices %v, want %v", got[1], want)
	}
}

func TestSplit(t *testing.T) {
	x := Floats(sh(2, 3), seq(6)...)
	got, err := runOp("Split", []*Tensor{&x, i64(sh(2), 1, 2)}, 2, aInt("axis", 1))
	if err != nil {
		t.Fatal(err)
	}
	if !equalTensor(got[0], Floats(sh(2, 1), 0, 3)) || !equalTensor(got[1], Floats(sh(2, 2), 1, 2, 4, 5)) {
		t.Errorf("split %v", got)
	}
	got, err = runOp("Split", []*Tensor{&x}, 2, aInt("axis", 0))
	if err != nil {
		t.Fatal(err)
	}
	if !equalTensor(got[0], Floats(sh(1, 3), 0, 1, 2)) || !equalTensor(got[1], Floats(sh(1, 3), 3, 4, 5)) {
		t.Errorf("equal split %v", got)
	}
}

func TestConstant(t *testing.T) {
	raw := []byte{1, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	got, err := runOp("Constant", nil, 1, &onnxpb.AttributeProto{Name: "value", Type: onnxpb.AttributeProto_TENSOR,
		T: &onnxpb.TensorProto{Dims: []int64{2}, DataType: int32(Int64), RawData: raw}})
	if err != nil {
		t.Fatal(err)
	}
	if !equalTensor(got[0], Ints(sh(2), 1, -2)) {
		t.Errorf("raw int64 constant %v", got[0])
	}
	got, err = runOp("Constant", nil, 1, &onnxpb.AttributeProto{Name: "value", Type: onnxpb.AttributeProto_TENSOR,
		T: &onnxpb.TensorProto{Dims: []int64{}, DataType: int32(Float16), Int32Data: []int32{0x3c00}}})
	if err != nil {
		t.Fatal(err)
	}
	if !equalTensor(got[0], FloatsOf(Float16, scalar, 1)) {
		t.Errorf("float16 constant from int32_data %v", got[0])
	}
	got, err = runOp("Constant", nil, 1, &onnxpb.AttributeProto{Name: "value_floats", Type: onnxpb.AttributeProto_FLOATS, Floats: []float32{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	if !equalTensor(got[0], Floats(sh(2), 1, 2)) {
		t.Errorf("value_floats %v", got[0])
	}
}

// Float16 results are rounded after every op: 1 + 2^-11 is not a float16.
func TestHalfPrecisionRounding(t *testing.T) {
	a, b := FloatsOf(Float16, sh(1), 1), FloatsOf(Float16, sh(1), 1.0/2048)
	got, err := runOp("Add", []*Tensor{&a, &b}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].F[0] != 1 || got[0].DType != Float16 {
		t.Errorf("float16 1 + 2^-11 = %v, want 1 (round to even)", got[0])
	}
	c, d := FloatsOf(BFloat16, sh(1), 1), FloatsOf(BFloat16, sh(1), 3.0/256)
	got, err = runOp("Add", []*Tensor{&c, &d}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].F[0] != 1.015625 {
		t.Errorf("bfloat16 1 + 3/256 = %v, want 1.015625", got[0].F[0])
	}
}

func TestErrors(t *testing.T) {
	cases := []struct {
		name, op string
		in       []*Tensor
		want     string
	}{
		{"unsupported op", "Conv", []*Tensor{f32(sh(1), 1)}, `op "Conv" is not supported`},
		{"no broadcast", "Add", []*Tensor{f32(sh(2), 1, 2), f32(sh(3), 1, 2, 3)}, "do not broadcast"},
		{"mixed types", "Add", []*Tensor{f32(sh(1), 1), i64(sh(1), 1)}, "one type"},
		{"bad reshape", "Reshape", []*Tensor{f32(sh(3), 1, 2, 3), i64(sh(1), 2)}, "cannot reshape"},
		{"gather out of range", "Gather", []*Tensor{f32(sh(2), 1, 2), i64(sh(1), 2)}, "out of range"},
		{"wrong storage", "Neg", []*Tensor{{DType: Float32, Shape: sh(2), F: []float32{1}}}, "needs 2 values"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runOp(tc.op, tc.in, 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// A call into another domain binds inputs by position and resolves the
// callee's attribute references from the call node.
func TestFunctionCallWithAttributeReference(t *testing.T) {
	callee := &onnxpb.FunctionProto{Domain: "lib", Name: "AddEps", Input: []string{"x"}, Output: []string{"y"}, Attribute: []string{"eps"},
		Node: []*onnxpb.NodeProto{
			{OpType: "Constant", Output: []string{"c"}, Attribute: []*onnxpb.AttributeProto{{Name: "value_float", Type: onnxpb.AttributeProto_FLOAT, RefAttrName: "eps"}}},
			{OpType: "Add", Input: []string{"x", "c"}, Output: []string{"y"}},
		}}
	caller := &onnxpb.FunctionProto{Domain: "m", Name: "F", Input: []string{"a"}, Output: []string{"b"},
		Node: []*onnxpb.NodeProto{{OpType: "AddEps", Domain: "lib", Input: []string{"a"}, Output: []string{"b"},
			Attribute: []*onnxpb.AttributeProto{{Name: "eps", Type: onnxpb.AttributeProto_FLOAT, F: 0.5}}}}}
	res, err := Run(caller, []*onnxpb.FunctionProto{callee}, map[string]Tensor{"a": Floats(sh(2), 1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if !equalTensor(res["b"], Floats(sh(2), 1.5, 2.5)) {
		t.Errorf("b = %v", res["b"])
	}
	if _, err := Run(caller, nil, map[string]Tensor{"a": Floats(sh(1), 1)}); err == nil || !strings.Contains(err.Error(), "no function lib::AddEps") {
		t.Errorf("missing dependency: %v", err)
	}
	if _, err := Run(caller, nil, map[string]Tensor{}); err == nil || !strings.Contains(err.Error(), `input "a" not given`) {
		t.Errorf("missing input: %v", err)
	}
}
