package fn

// Thin helpers over single ONNX operators (opset 17), named as the operators
// are, so a block reads like the math it computes.

func (f *Func) Add(a, b Value) Value    { return f.Op("Add", []Value{a, b}) }
func (f *Func) Sub(a, b Value) Value    { return f.Op("Sub", []Value{a, b}) }
func (f *Func) Mul(a, b Value) Value    { return f.Op("Mul", []Value{a, b}) }
func (f *Func) Div(a, b Value) Value    { return f.Op("Div", []Value{a, b}) }
func (f *Func) MatMul(a, b Value) Value { return f.Op("MatMul", []Value{a, b}) }
func (f *Func) Neg(x Value) Value       { return f.Op("Neg", []Value{x}) }
func (f *Func) Sigmoid(x Value) Value   { return f.Op("Sigmoid", []Value{x}) }
func (f *Func) Cos(x Value) Value       { return f.Op("Cos", []Value{x}) }
func (f *Func) Sin(x Value) Value       { return f.Op("Sin", []Value{x}) }
func (f *Func) Shape(x Value) Value     { return f.Op("Shape", []Value{x}) }

// Greater is a > b, elementwise with broadcasting.
func (f *Func) Greater(a, b Value) Value { return f.Op("Greater", []Value{a, b}) }

// Where is cond ? a : b.
func (f *Func) Where(cond, a, b Value) Value { return f.Op("Where", []Value{cond, a, b}) }

// Cast converts x to element type t.
func (f *Func) Cast(x Value, t DType) Value {
	return f.Op("Cast", []Value{x}, AttrInt("to", int64(t)))
}

// CastLike converts x to the element type of like.
func (f *Func) CastLike(x, like Value) Value { return f.Op("CastLike", []Value{x, like}) }

// Reshape reshapes x to a constant shape (0 copies the input dimension, -1 is inferred).
func (f *Func) Reshape(x Value, shape ...int64) Value {
	return f.Op("Reshape", []Value{x, f.Ints(shape...)})
}

// Transpose permutes the axes of x.
func (f *Func) Transpose(x Value, perm ...int64) Value {
	return f.Op("Transpose", []Value{x}, AttrInts("perm", perm...))
}

// Unsqueeze inserts axes of size 1.
func (f *Func) Unsqueeze(x Value, axes ...int64) Value {
	return f.Op("Unsqueeze", []Value{x, f.Ints(axes...)})
}

// Concat joins values along axis.
func (f *Func) Concat(axis int64, xs ...Value) Value {
	return f.Op("Concat", xs, AttrInt("axis", axis))
}

// Split splits x along axis into parts of the given sizes.
func (f *Func) Split(x Value, axis int64, sizes ...int64) []Value {
	return f.OpN("Split", "", len(sizes), []Value{x, f.Ints(sizes...)}, AttrInt("axis", axis))
}

// Gather takes the entries of data at indices along axis.
func (f *Func) Gather(data, indices Value, axis int64) Value {
	return f.Op("Gather", []Value{data, indices}, AttrInt("axis", axis))
}

// Softmax over axis.
func (f *Func) Softmax(x Value, axis int64) Value {
	return f.Op("Softmax", []Value{x}, AttrInt("axis", axis))
}

// Dim is dimension i of x's shape as a scalar int64.
func (f *Func) Dim(x Value, i int64) Value {
	return f.Gather(f.Shape(x), f.Int(i), 0)
}

// ReduceMax over axes (opset 17: axes is an attribute).
func (f *Func) ReduceMax(x Value, keepdims bool, axes ...int64) Value {
	return f.Op("ReduceMax", []Value{x}, AttrInts("axes", axes...), AttrInt("keepdims", boolInt(keepdims)))
}

// ReduceMean over axes (opset 17: axes is an attribute).
func (f *Func) ReduceMean(x Value, keepdims bool, axes ...int64) Value {
	return f.Op("ReduceMean", []Value{x}, AttrInts("axes", axes...), AttrInt("keepdims", boolInt(keepdims)))
}

// ArgMax over axis.
func (f *Func) ArgMax(x Value, axis int64, keepdims bool) Value {
	return f.Op("ArgMax", []Value{x}, AttrInt("axis", axis), AttrInt("keepdims", boolInt(keepdims)))
}

// Range is start, start+delta, ... below limit (scalars).
func (f *Func) Range(start, limit, delta Value) Value {
	return f.Op("Range", []Value{start, limit, delta})
}

// CastTo converts x to t unless the caller knows it already is t.
func (f *Func) CastTo(x Value, from, to DType) Value {
	if from == to {
		return x
	}
	return f.Cast(x, to)
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// TopK returns the k largest entries along the last axis, largest first,
// and their int64 indices.
func (f *Func) TopK(x Value, k int) (values, indices Value) {
	out := f.OpN("TopK", "", 2, []Value{x, f.Ints(int64(k))}, AttrInt("axis", -1), AttrInt("largest", 1), AttrInt("sorted", 1))
	return out[0], out[1]
}

// ReduceSum over axes (opset 13+: axes is an input).
func (f *Func) ReduceSum(x Value, keepdims bool, axes ...int64) Value {
	return f.Op("ReduceSum", []Value{x, f.Ints(axes...)}, AttrInt("keepdims", boolInt(keepdims)))
}

// ZerosLike is float32 zeros of x's shape.
func (f *Func) ZerosLike(x Value) Value { return f.filled(x, Float32, 0) }

// OnesLike is ones of x's shape in dtype t.
func (f *Func) OnesLike(x Value, t DType) Value { return f.filled(x, t, 1) }

func (f *Func) filled(x Value, t DType, v float32) Value {
	return f.Op("ConstantOfShape", []Value{f.Shape(x)}, AttrTensor("value", MustFloatTensor(t, v)))
}
