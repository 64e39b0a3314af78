package transform

import "slices"

// HoistDequant rewrites, bottom-up, a stack of identical dequantisations
// into one dequantisation of stacked operands:
//
//	stack(a, dequant(q₀, s₀), dequant(q₁, s₁), ...) = dequant(stack(a, q…), stack(a, s…))
//
// (and likewise through unpack_int, unpack_fp4 and cast), which holds
// element by element because each operation is elementwise over the axes
// the stack adds. A MoE layer's 128 dequantised experts then lower to one
// dequantisation over stacked initializers instead of 128 (Qwen3-235B-FP8:
// 376,000 nodes). e must have been through Infer; the result must be again.
// Materialised weights are computed a part (an expert) at a time and keep
// the per-expert form.
func (e *Expr) HoistDequant() *Expr {
	for i, a := range e.Args {
		e.Args[i] = a.HoistDequant()
	}
	if e.Op == OpStack {
		if h, ok := hoistStack(e); ok {
			return h
		}
	}
	return e
}

func hoistStack(e *Expr) (*Expr, bool) {
	first := e.Args[0]
	if first.IsLeaf() || len(e.Args) < 2 {
		return nil, false
	}
	for _, a := range e.Args[1:] {
		if !sameOp(first, a) {
			return nil, false
		}
	}
	rank := int64(len(first.Type.Shape))
	out := &Expr{Op: first.Op, Ints: slices.Clone(first.Ints), Axis: first.Axis, Start: first.Start, End: first.End, Step: first.Step, To: first.To}
	switch first.Op {
	case OpDequant, OpFP8:
		// The block grid is the last two axes: the stack must come before
		// them, and every operand must be a grid (not one value per tensor).
		if e.Axis > rank-2 || slices.ContainsFunc(first.Args[1:], func(x *Expr) bool { return int64(len(x.Type.Shape)) != rank }) {
			return nil, false
		}
	case OpUnpackInt:
		if out.Axis >= e.Axis {
			out.Axis++
		}
	case OpUnpackFP4:
		if e.Axis > rank-1 {
			return nil, false
		}
	case OpCast:
	default:
		return nil, false
	}
	for j := range first.Args {
		operands := make([]*Expr, len(e.Args))
		for i, a := range e.Args {
			operands[i] = a.Args[j]
		}
		stacked := &Expr{Op: OpStack, Axis: e.Axis, Args: operands}
		if h, ok := hoistStack(stacked); ok {
			out.Args = append(out.Args, h)
		} else {
			out.Args = append(out.Args, stacked)
		}
	}
	return out, true
}

// sameOp: the same operation with the same parameters and operand shapes.
func sameOp(a, b *Expr) bool {
	if a.Op != b.Op || a.IsLeaf() || len(a.Args) != len(b.Args) || !slices.Equal(a.Ints, b.Ints) || a.Axis != b.Axis ||
		a.Start != b.Start || a.End != b.End || a.Step != b.Step || a.To != b.To {
		return false
	}
	for i := range a.Args {
		if a.Args[i].Type.DType != b.Args[i].Type.DType || !slices.Equal(a.Args[i].Type.Shape, b.Args[i].Type.Shape) {
			return false
		}
	}
	return true
}
