package refeval

import (
	"fmt"
	"math"
)

// Elementwise ops with numpy-style broadcasting.

func init() {
	register(map[string]opFunc{
		"Add": arith(func(a, b float32) float32 { return a + b }, func(a, b int64) int64 { return a + b }),
		"Sub": arith(func(a, b float32) float32 { return a - b }, func(a, b int64) int64 { return a - b }),
		"Mul": arith(func(a, b float32) float32 { return a * b }, func(a, b int64) int64 { return a * b }),
		"Div": arith(func(a, b float32) float32 { return a / b }, func(a, b int64) int64 {
			if b == 0 {
				return 0 // undefined in ONNX; avoid a panic
			}
			return a / b
		}),
		"Pow": powOp,
		"Mod": modOp,

		"Max": variadic(func(a, b float32) float32 {
			if a != a || b != b {
				return float32(math.NaN())
			}
			return max(a, b)
		}, func(a, b int64) int64 { return max(a, b) }),
		"Min": variadic(func(a, b float32) float32 {
			if a != a || b != b {
				return float32(math.NaN())
			}
			return min(a, b)
		}, func(a, b int64) int64 { return min(a, b) }),
		"Sum": variadic(func(a, b float32) float32 { return a + b }, func(a, b int64) int64 { return a + b }),

		"Equal":          compare(func(a, b float64) bool { return a == b }),
		"Less":           compare(func(a, b float64) bool { return a < b }),
		"LessOrEqual":    compare(func(a, b float64) bool { return a <= b }),
		"Greater":        compare(func(a, b float64) bool { return a > b }),
		"GreaterOrEqual": compare(func(a, b float64) bool { return a >= b }),

		"And": logical(func(a, b bool) bool { return a && b }),
		"Or":  logical(func(a, b bool) bool { return a || b }),
		"Xor": logical(func(a, b bool) bool { return a != b }),
		"Not": notOp,

		"Neg":        unary(func(x float64) float64 { return -x }, func(x int64) int64 { return -x }),
		"Abs":        unary(math.Abs, func(x int64) int64 { return max(x, -x) }),
		"Sqrt":       unary(math.Sqrt, nil),
		"Reciprocal": unary(func(x float64) float64 { return 1 / x }, nil),
		"Exp":        unary(math.Exp, nil),
		"Log":        unary(math.Log, nil),
		"Sigmoid":    unary(sigmoid, nil),
		"Tanh":       unary(math.Tanh, nil),
		"Erf":        unary(math.Erf, nil),
		"Cos":        unary(math.Cos, nil),
		"Sin":        unary(math.Sin, nil),
		"Floor":      unary(math.Floor, nil),
		"Ceil":       unary(math.Ceil, nil),

		"Where": whereOp,
		"Clip":  clipOp,
	})
}

func sigmoid(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// broadcastShape is the numpy broadcast of shapes.
func broadcastShape(shapes ...[]int64) ([]int64, error) {
	rank := 0
	for _, s := range shapes {
		rank = max(rank, len(s))
	}
	out := make([]int64, rank)
	for i := range out {
		out[i] = 1
	}
	for _, s := range shapes {
		off := rank - len(s)
		for i, d := range s {
			switch {
			case d == out[off+i] || d == 1:
			case out[off+i] == 1:
				out[off+i] = d
			default:
				return nil, fmt.Errorf("shapes %v do not broadcast", shapes)
			}
		}
	}
	return out, nil
}

// broadcastIndex maps each flat index of out to the flat index of an input
// of shape in broadcast to out.
func broadcastIndex(out, in []int64) []int {
	n := numel(out)
	res := make([]int, n)
	st := strides(in)
	off := len(out) - len(in)
	idx := make([]int, len(out))
	for i := range n {
		unravel(i, out, idx)
		j := 0
		for d := range in {
			if in[d] != 1 {
				j += idx[off+d] * st[d]
			}
		}
		res[i] = j
	}
	return res
}

func sameType(ts ...Tensor) error {
	for _, t := range ts[1:] {
		if t.DType != ts[0].DType {
			return fmt.Errorf("inputs of types %s and %s (ONNX needs one type)", ts[0].DType, t.DType)
		}
	}
	return nil
}

// broadcast2 broadcasts a and b into a tensor of dtype dt, calling set(i, ia, ib).
func broadcast2(a, b Tensor, dt DType, set func(out Tensor, i, ia, ib int)) (Tensor, error) {
	shape, err := broadcastShape(a.Shape, b.Shape)
	if err != nil {
		return Tensor{}, err
	}
	out := alloc(dt, shape)
	ia, ib := broadcastIndex(shape, a.Shape), broadcastIndex(shape, b.Shape)
	for i := range ia {
		set(out, i, ia[i], ib[i])
	}
	return out, nil
}

func arith(ff func(a, b float32) float32, fi func(a, b int64) int64) opFunc {
	return func(n *node) ([]Tensor, error) {
		if err := n.inputs(2, 2); err != nil {
			return nil, err
		}
		a, b := *n.in[0], *n.in[1]
		return one(arithTensors(a, b, ff, fi))
	}
}

func arithTensors(a, b Tensor, ff func(a, b float32) float32, fi func(a, b int64) int64) (Tensor, error) {
	if err := sameType(a, b); err != nil {
		return Tensor{}, err
	}
	switch {
	case isFloat(a.DType):
		return broadcast2(a, b, a.DType, func(o Tensor, i, ia, ib int) { o.F[i] = ff(a.F[ia], b.F[ib]) })
	case isInt(a.DType) && fi != nil:
		return broadcast2(a, b, a.DType, func(o Tensor, i, ia, ib int) { o.I[i] = fi(a.I[ia], b.I[ib]) })
	}
	return Tensor{}, fmt.Errorf("not defined for %s", a.DType)
}

func variadic(ff func(a, b float32) float32, fi func(a, b int64) int64) opFunc {
	return func(n *node) ([]Tensor, error) {
		if len(n.in) == 0 {
			return nil, fmt.Errorf("takes at least one input")
		}
		acc, err := n.input(0)
		if err != nil {
			return nil, err
		}
		for i := 1; i < len(n.in); i++ {
			b, err := n.input(i)
			if err != nil {
				return nil, err
			}
			if acc, err = arithTensors(acc, b, ff, fi); err != nil {
				return nil, err
			}
		}
		if len(n.in) == 1 {
			acc = clone(acc)
		}
		return []Tensor{acc}, nil
	}
}

func powOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 2); err != nil {
		return nil, err
	}
	a, b := *n.in[0], *n.in[1]
	if !isFloat(a.DType) {
		return nil, fmt.Errorf("base of type %s not supported", a.DType)
	}
	return one(broadcast2(a, b, a.DType, func(o Tensor, i, ia, ib int) {
		o.F[i] = float32(math.Pow(float64(a.F[ia]), b.float64At(ib)))
	}))
}

// modOp: fmod=0 (integers) takes the divisor's sign, fmod=1 the dividend's.
func modOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 2); err != nil {
		return nil, err
	}
	a, b := *n.in[0], *n.in[1]
	fmod := n.attrInt("fmod", 0) == 1
	if isFloat(a.DType) && !fmod {
		return nil, fmt.Errorf("float inputs need fmod=1")
	}
	return one(arithTensors(a, b,
		func(x, y float32) float32 { return float32(math.Mod(float64(x), float64(y))) },
		func(x, y int64) int64 {
			if y == 0 {
				return 0
			}
			r := x % y
			if !fmod && r != 0 && (r < 0) != (y < 0) {
				r += y
			}
			return r
		}))
}

func compare(f func(a, b float64) bool) opFunc {
	return func(n *node) ([]Tensor, error) {
		if err := n.inputs(2, 2); err != nil {
			return nil, err
		}
		a, b := *n.in[0], *n.in[1]
		if err := sameType(a, b); err != nil {
			return nil, err
		}
		if isInt(a.DType) { // compare integers exactly, not through float64
			return one(broadcast2(a, b, Bool, func(o Tensor, i, ia, ib int) {
				x, y := a.I[ia], b.I[ib]
				o.B[i] = f(float64(cmpInt(x, y)), 0)
			}))
		}
		return one(broadcast2(a, b, Bool, func(o Tensor, i, ia, ib int) { o.B[i] = f(a.float64At(ia), b.float64At(ib)) }))
	}
}

func cmpInt(x, y int64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

func logical(f func(a, b bool) bool) opFunc {
	return func(n *node) ([]Tensor, error) {
		if err := n.inputs(2, 2); err != nil {
			return nil, err
		}
		a, b := *n.in[0], *n.in[1]
		if a.DType != Bool || b.DType != Bool {
			return nil, fmt.Errorf("wants bool inputs, got %s and %s", a.DType, b.DType)
		}
		return one(broadcast2(a, b, Bool, func(o Tensor, i, ia, ib int) { o.B[i] = f(a.B[ia], b.B[ib]) }))
	}
}

func notOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	if err != nil {
		return nil, err
	}
	if x.DType != Bool {
		return nil, fmt.Errorf("wants a bool input, got %s", x.DType)
	}
	out := alloc(Bool, x.Shape)
	for i, v := range x.B {
		out.B[i] = !v
	}
	return []Tensor{out}, nil
}

// unary applies ff (in float64, rounded once) to floats, fi to integers.
func unary(ff func(float64) float64, fi func(int64) int64) opFunc {
	return func(n *node) ([]Tensor, error) {
		if err := n.inputs(1, 1); err != nil {
			return nil, err
		}
		x := *n.in[0]
		out := alloc(x.DType, x.Shape)
		switch {
		case isFloat(x.DType):
			for i, v := range x.F {
				out.F[i] = float32(ff(float64(v)))
			}
		case isInt(x.DType) && fi != nil:
			for i, v := range x.I {
				out.I[i] = fi(v)
			}
		default:
			return nil, fmt.Errorf("not defined for %s", x.DType)
		}
		return []Tensor{out}, nil
	}
}

func whereOp(n *node) ([]Tensor, error) {
	if err := n.inputs(3, 3); err != nil {
		return nil, err
	}
	c, a, b := *n.in[0], *n.in[1], *n.in[2]
	if c.DType != Bool {
		return nil, fmt.Errorf("condition of type %s, want bool", c.DType)
	}
	if err := sameType(a, b); err != nil {
		return nil, err
	}
	shape, err := broadcastShape(c.Shape, a.Shape, b.Shape)
	if err != nil {
		return nil, err
	}
	out := alloc(a.DType, shape)
	ic, ia, ib := broadcastIndex(shape, c.Shape), broadcastIndex(shape, a.Shape), broadcastIndex(shape, b.Shape)
	for i := range ic {
		if c.B[ic[i]] {
			copyElem(out, i, a, ia[i])
		} else {
			copyElem(out, i, b, ib[i])
		}
	}
	return []Tensor{out}, nil
}

// clipOp: min and max are optional scalar inputs (opset 11+).
func clipOp(n *node) ([]Tensor, error) {
	if err := n.inputs(1, 3); err != nil {
		return nil, err
	}
	x := *n.in[0]
	lo, hi := math.Inf(-1), math.Inf(1)
	for i, bound := range []*float64{&lo, &hi} {
		t := n.optional(i + 1)
		if t == nil {
			continue
		}
		if t.DType != x.DType {
			return nil, fmt.Errorf("bound of type %s for input of type %s", t.DType, x.DType)
		}
		v, err := t.scalar()
		if err != nil {
			return nil, fmt.Errorf("bound: %w", err)
		}
		*bound = v
	}
	out := alloc(x.DType, x.Shape)
	for i := range x.Len() {
		v := x.float64At(i)
		if v < lo {
			v = lo
		}
		if v > hi {
			v = hi
		}
		if out.F != nil {
			out.F[i] = float32(v)
		} else {
			out.I[i] = int64(v)
		}
	}
	return []Tensor{out}, nil
}

func clone(t Tensor) Tensor {
	out := Tensor{DType: t.DType, Shape: append([]int64{}, t.Shape...)}
	if t.F != nil {
		out.F = append([]float32{}, t.F...)
	}
	if t.I != nil {
		out.I = append([]int64{}, t.I...)
	}
	if t.B != nil {
		out.B = append([]bool{}, t.B...)
	}
	return out
}
