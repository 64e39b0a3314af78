package refeval

import (
	"fmt"
	"math"
	"sort"
)

// Reductions, Softmax, ArgMax, TopK and MatMul. Sums accumulate in float64
// and round once.

func init() {
	register(map[string]opFunc{
		"ReduceSum":  reduceOp(func(v []float64) float64 { return sum(v) }),
		"ReduceMean": reduceOp(func(v []float64) float64 { return sum(v) / float64(len(v)) }),
		"ReduceMax":  reduceOp(func(v []float64) float64 { return extreme(v, math.Inf(-1), func(a, b float64) bool { return a > b }) }),
		"ReduceMin":  reduceOp(func(v []float64) float64 { return extreme(v, math.Inf(1), func(a, b float64) bool { return a < b }) }),
		"ArgMax":     argOp(func(a, b float64) bool { return a > b }),
		"ArgMin":     argOp(func(a, b float64) bool { return a < b }),
		"Softmax":    softmaxOp,
		"TopK":       topKOp,
		"MatMul":     matMulOp,
		"CumSum":     cumSumOp,
	})
}

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

// extreme is the max (or min) of v; NaN wins.
func extreme(v []float64, init float64, better func(a, b float64) bool) float64 {
	m := init
	for _, x := range v {
		if x != x {
			return x
		}
		if better(x, m) {
			m = x
		}
	}
	return m
}

// lanes calls fn for every position of the reduced axes with the flat
// offsets of the elements along them. keep marks the reduced axes.
func lanes(shape []int64, reduced []bool, fn func(out int, offs []int)) {
	var outShape, redShape []int64
	for d, s := range shape {
		if reduced[d] {
			redShape = append(redShape, s)
		} else {
			outShape = append(outShape, s)
		}
	}
	st := strides(shape)
	oc, rc := make([]int, len(outShape)), make([]int, len(redShape))
	offs := make([]int, numel(redShape))
	for o := range numel(outShape) {
		unravel(o, outShape, oc)
		base, k := 0, 0
		for d := range shape {
			if !reduced[d] {
				base += oc[k] * st[d]
				k++
			}
		}
		for r := range offs {
			unravel(r, redShape, rc)
			off, k := base, 0
			for d := range shape {
				if reduced[d] {
					off += rc[k] * st[d]
					k++
				}
			}
			offs[r] = off
		}
		fn(o, offs)
	}
}

// reducedShape is shape with the reduced axes dropped or, keepdims, 1.
func reducedShape(shape []int64, reduced []bool, keep bool) []int64 {
	out := []int64{}
	for d, s := range shape {
		switch {
		case !reduced[d]:
			out = append(out, s)
		case keep:
			out = append(out, 1)
		}
	}
	return out
}

// reduceOp: axes from input 1 (ReduceSum 13+, all 18+) or the attribute;
// none reduces all axes unless noop_with_empty_axes.
func reduceOp(f func([]float64) float64) opFunc {
	return func(n *node) ([]Tensor, error) {
		if err := n.inputs(1, 2); err != nil {
			return nil, err
		}
		x := *n.in[0]
		axes, err := n.axesInput(1)
		if err != nil {
			return nil, err
		}
		if len(axes) == 0 && n.attrInt("noop_with_empty_axes", 0) == 1 {
			return []Tensor{clone(x)}, nil
		}
		reduced := make([]bool, len(x.Shape))
		for _, a := range axes {
			ax, err := normAxis(a, len(x.Shape))
			if err != nil {
				return nil, err
			}
			reduced[ax] = true
		}
		if len(axes) == 0 {
			for i := range reduced {
				reduced[i] = true
			}
		}
		if x.DType == Bool {
			return nil, fmt.Errorf("not defined for bool")
		}
		out := alloc(x.DType, reducedShape(x.Shape, reduced, n.attrInt("keepdims", 1) == 1))
		vals := []float64{}
		lanes(x.Shape, reduced, func(o int, offs []int) {
			vals = vals[:0]
			for _, j := range offs {
				vals = append(vals, x.float64At(j))
			}
			r := f(vals)
			if out.F != nil {
				out.F[o] = float32(r)
			} else {
				out.I[o] = int64(r)
			}
		})
		return []Tensor{out}, nil
	}
}

func oneAxis(x Tensor, n *node, def int64) ([]bool, int, error) {
	axis, err := normAxis(n.attrInt("axis", def), len(x.Shape))
	if err != nil {
		return nil, 0, err
	}
	reduced := make([]bool, len(x.Shape))
	reduced[axis] = true
	return reduced, axis, nil
}

// argOp: the first extreme index, or the last with select_last_index.
func argOp(better func(a, b float64) bool) opFunc {
	return func(n *node) ([]Tensor, error) {
		x, err := n.input(0)
		if err != nil {
			return nil, err
		}
		reduced, _, err := oneAxis(x, n, 0)
		if err != nil {
			return nil, err
		}
		last := n.attrInt("select_last_index", 0) == 1
		out := alloc(Int64, reducedShape(x.Shape, reduced, n.attrInt("keepdims", 1) == 1))
		lanes(x.Shape, reduced, func(o int, offs []int) {
			best := 0
			for k := 1; k < len(offs); k++ {
				a, b := x.float64At(offs[k]), x.float64At(offs[best])
				if better(a, b) || (last && a == b) {
					best = k
				}
			}
			out.I[o] = int64(best)
		})
		return []Tensor{out}, nil
	}
}

// softmaxOp over one axis (opset 13): exp(x - max) / sum, in float64.
func softmaxOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	if err != nil {
		return nil, err
	}
	if !isFloat(x.DType) {
		return nil, fmt.Errorf("not defined for %s", x.DType)
	}
	reduced, _, err := oneAxis(x, n, -1)
	if err != nil {
		return nil, err
	}
	out := alloc(x.DType, append([]int64{}, x.Shape...))
	lanes(x.Shape, reduced, func(_ int, offs []int) {
		m := math.Inf(-1)
		for _, j := range offs {
			m = math.Max(m, float64(x.F[j]))
		}
		var s float64
		e := make([]float64, len(offs))
		for k, j := range offs {
			e[k] = math.Exp(float64(x.F[j]) - m)
			s += e[k]
		}
		for k, j := range offs {
			out.F[j] = float32(e[k] / s)
		}
	})
	return []Tensor{out}, nil
}

// topKOp: the k largest (or smallest) along axis, sorted; equal values keep
// the lower index first, as ONNX specifies.
func topKOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 2); err != nil {
		return nil, err
	}
	x := *n.in[0]
	kt, err := n.in[1].ints()
	if err != nil || len(kt) != 1 {
		return nil, fmt.Errorf("K must be one int64, got %v", n.in[1].Shape)
	}
	reduced, axis, err := oneAxis(x, n, -1)
	if err != nil {
		return nil, err
	}
	k := int(kt[0])
	if k < 0 || int64(k) > x.Shape[axis] {
		return nil, fmt.Errorf("k %d for axis of size %d", k, x.Shape[axis])
	}
	largest := n.attrInt("largest", 1) == 1
	shape := append([]int64{}, x.Shape...)
	shape[axis] = int64(k)
	values, indices := alloc(x.DType, shape), alloc(Int64, shape)
	// Output offsets: same lanes over the output shape.
	var outLanes [][]int
	lanes(shape, reduced, func(_ int, offs []int) { outLanes = append(outLanes, append([]int{}, offs...)) })
	o := 0
	lanes(x.Shape, reduced, func(_ int, offs []int) {
		order := make([]int, len(offs))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool {
			va, vb := x.float64At(offs[order[a]]), x.float64At(offs[order[b]])
			if largest {
				return va > vb
			}
			return va < vb
		})
		for r := range k {
			copyElem(values, outLanes[o][r], x, offs[order[r]])
			indices.I[outLanes[o][r]] = int64(order[r])
		}
		o++
	})
	return []Tensor{values, indices}, nil
}

// matMulOp is numpy matmul: 1-D operands are promoted and the promoted
// axis removed; batch axes broadcast.
func matMulOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 2); err != nil {
		return nil, err
	}
	a, b := *n.in[0], *n.in[1]
	if err := sameType(a, b); err != nil {
		return nil, err
	}
	if a.DType == Bool || len(a.Shape) == 0 || len(b.Shape) == 0 {
		return nil, fmt.Errorf("operands %s %v and %v", a.DType, a.Shape, b.Shape)
	}
	as, bs := a.Shape, b.Shape
	if len(as) == 1 {
		as = []int64{1, as[0]}
	}
	if len(bs) == 1 {
		bs = []int64{bs[0], 1}
	}
	m, kk, k2, nn := as[len(as)-2], as[len(as)-1], bs[len(bs)-2], bs[len(bs)-1]
	if kk != k2 {
		return nil, fmt.Errorf("shapes %v and %v do not multiply", a.Shape, b.Shape)
	}
	batch, err := broadcastShape(as[:len(as)-2], bs[:len(bs)-2])
	if err != nil {
		return nil, err
	}
	ia, ib := broadcastIndex(batch, as[:len(as)-2]), broadcastIndex(batch, bs[:len(bs)-2])
	outShape := append(append([]int64{}, batch...), m, nn)
	out := alloc(a.DType, outShape)
	M, K, N := int(m), int(kk), int(nn)
	for bi := range ia {
		pa, pb, po := ia[bi]*M*K, ib[bi]*K*N, bi*M*N
		for i := range M {
			for j := range N {
				var s float64
				for l := range K {
					s += a.float64At(pa+i*K+l) * b.float64At(pb+l*N+j)
				}
				if out.F != nil {
					out.F[po+i*N+j] = float32(s)
				} else {
					out.I[po+i*N+j] = int64(s)
				}
			}
		}
	}
	// Drop the promoted axes of 1-D operands.
	final := append([]int64{}, batch...)
	if len(a.Shape) > 1 {
		final = append(final, m)
	}
	if len(b.Shape) > 1 {
		final = append(final, nn)
	}
	out.Shape = final
	return []Tensor{out}, nil
}

// cumSumOp: running sums along the axis input (int64 exactly, floats in
// float64 rounded per element); exclusive and reverse are refused.
func cumSumOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 2); err != nil {
		return nil, err
	}
	if n.attrInt("exclusive", 0) != 0 || n.attrInt("reverse", 0) != 0 {
		return nil, fmt.Errorf("CumSum: exclusive and reverse are not supported")
	}
	x := *n.in[0]
	a, err := n.in[1].scalar()
	if err != nil {
		return nil, fmt.Errorf("CumSum axis: %w", err)
	}
	axis, err := normAxis(int64(a), len(x.Shape))
	if err != nil {
		return nil, err
	}
	reduced := make([]bool, len(x.Shape))
	reduced[axis] = true
	out := alloc(x.DType, x.Shape)
	lanes(x.Shape, reduced, func(_ int, offs []int) {
		var acc float64
		var iacc int64
		for _, o := range offs {
			if isInt(x.DType) {
				iacc += x.I[o]
				out.I[o] = iacc
			} else {
				acc += x.float64At(o)
				out.F[o] = float32(acc)
			}
		}
	})
	out.round()
	return []Tensor{out}, nil
}

func init() {
	register(map[string]opFunc{"Gemm": gemmOp, "Flatten": flattenOp})
}

// gemmOp is alpha·A'·B' + beta·C with A' = Aᵀ if transA, B' = Bᵀ if
// transB (2-D operands), C broadcast to the product.
func gemmOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 3); err != nil {
		return nil, err
	}
	a, b := *n.in[0], *n.in[1]
	if err := sameType(a, b); err != nil {
		return nil, err
	}
	if len(a.Shape) != 2 || len(b.Shape) != 2 || a.F == nil {
		return nil, fmt.Errorf("Gemm takes 2-D float operands, got %v and %v", a.Shape, b.Shape)
	}
	ta, tb := n.attrInt("transA", 0) == 1, n.attrInt("transB", 0) == 1
	m, k := a.Shape[0], a.Shape[1]
	if ta {
		m, k = k, m
	}
	k2, nn := b.Shape[0], b.Shape[1]
	if tb {
		k2, nn = nn, k2
	}
	if k != k2 {
		return nil, fmt.Errorf("Gemm: shapes %v and %v do not multiply (transA %v, transB %v)", a.Shape, b.Shape, ta, tb)
	}
	at := func(i, l int64) float64 {
		if ta {
			return a.float64At(int(l*m + i))
		}
		return a.float64At(int(i*k + l))
	}
	bt := func(l, j int64) float64 {
		if tb {
			return b.float64At(int(j*k + l))
		}
		return b.float64At(int(l*nn + j))
	}
	alpha, beta := float64(n.attrFloat("alpha", 1)), float64(n.attrFloat("beta", 1))
	y := alloc(a.DType, []int64{m, nn})
	for i := range m {
		for j := range nn {
			var s float64
			for l := range k {
				s += at(i, l) * bt(l, j)
			}
			y.F[i*nn+j] = float32(alpha * s)
		}
	}
	c := n.optional(2)
	if c == nil {
		return []Tensor{y}, nil
	}
	scaled := clone(*c)
	for i := range scaled.F {
		scaled.F[i] = float32(beta * float64(scaled.F[i]))
	}
	return ops["Add"](&node{op: "Add", in: []*Tensor{&y, &scaled}, nOut: 1, attrs: n.attrs})
}

// flattenOp reshapes to [prod(dims before axis), prod(the rest)].
func flattenOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	if err != nil {
		return nil, err
	}
	axis := n.attrInt("axis", 1)
	if axis < 0 {
		axis += int64(len(x.Shape))
	}
	if axis < 0 || axis > int64(len(x.Shape)) {
		return nil, fmt.Errorf("Flatten axis %d of a rank-%d tensor", n.attrInt("axis", 1), len(x.Shape))
	}
	outer, inner := int64(1), int64(1)
	for i, d := range x.Shape {
		if int64(i) < axis {
			outer *= d
		} else {
			inner *= d
		}
	}
	y := clone(x)
	y.Shape = []int64{outer, inner}
	return []Tensor{y}, nil
}
