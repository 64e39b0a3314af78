package refeval

import (
	"fmt"
	"math"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Shape, layout, constant and type-conversion ops.

func init() {
	register(map[string]opFunc{
		"Identity":        identityOp,
		"Shape":           shapeOp,
		"Reshape":         reshapeOp,
		"Transpose":       transposeOp,
		"Unsqueeze":       unsqueezeOp,
		"Squeeze":         squeezeOp,
		"Concat":          concatOp,
		"Split":           splitOp,
		"Slice":           sliceOp,
		"Expand":          expandOp,
		"Tile":            tileOp,
		"Constant":        constantOp,
		"ConstantOfShape": constantOfShapeOp,
		"Range":           rangeOp,
		"Cast":            castOp,
		"CastLike":        castLikeOp,
	})
}

func identityOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	return one(clone(x), err)
}

// shapeOp honours start and end (opset 15), clamped like Python slices.
func shapeOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	if err != nil {
		return nil, err
	}
	r := int64(len(x.Shape))
	clampAxis := func(a int64) int64 {
		if a < 0 {
			a += r
		}
		return min(max(a, 0), r)
	}
	start, end := clampAxis(n.attrInt("start", 0)), clampAxis(n.attrInt("end", r))
	dims := []int64{}
	if start < end {
		dims = append(dims, x.Shape[start:end]...)
	}
	return []Tensor{Ints([]int64{int64(len(dims))}, dims...)}, nil
}

// withShape is x's data under a new shape of as many elements.
func withShape(x Tensor, shape []int64) Tensor {
	out := clone(x)
	out.Shape = shape
	return out
}

func reshapeOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 2); err != nil {
		return nil, err
	}
	x := *n.in[0]
	spec, err := n.in[1].ints()
	if err != nil {
		return nil, fmt.Errorf("shape: %w", err)
	}
	allowZero := n.attrInt("allowzero", 0) == 1
	shape := make([]int64, len(spec))
	infer, known := -1, 1
	for i, d := range spec {
		switch {
		case d == 0 && !allowZero:
			if i >= len(x.Shape) {
				return nil, fmt.Errorf("shape %v copies dimension %d of a rank-%d input", spec, i, len(x.Shape))
			}
			shape[i] = x.Shape[i]
		case d == -1:
			if infer >= 0 {
				return nil, fmt.Errorf("shape %v has two -1", spec)
			}
			infer = i
			continue
		case d < -1:
			return nil, fmt.Errorf("shape %v has dimension %d", spec, d)
		default:
			shape[i] = d
		}
		known *= int(shape[i])
	}
	if infer >= 0 {
		if known == 0 || x.Len()%known != 0 {
			return nil, fmt.Errorf("cannot reshape %v to %v", x.Shape, spec)
		}
		shape[infer] = int64(x.Len() / known)
	}
	if numel(shape) != x.Len() {
		return nil, fmt.Errorf("cannot reshape %v (%d elements) to %v", x.Shape, x.Len(), shape)
	}
	return []Tensor{withShape(x, shape)}, nil
}

func transposeOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	if err != nil {
		return nil, err
	}
	r := len(x.Shape)
	perm, ok := n.attrInts("perm")
	if !ok {
		for i := r - 1; i >= 0; i-- {
			perm = append(perm, int64(i))
		}
	}
	if len(perm) != r {
		return nil, fmt.Errorf("perm %v for rank %d", perm, r)
	}
	seen := make([]bool, r)
	shape := make([]int64, r)
	for i, p := range perm {
		if p < 0 || int(p) >= r || seen[p] {
			return nil, fmt.Errorf("perm %v is not a permutation of 0..%d", perm, r-1)
		}
		seen[p] = true
		shape[i] = x.Shape[p]
	}
	out := alloc(x.DType, shape)
	inSt := strides(x.Shape)
	idx := make([]int, r)
	for i := range out.Len() {
		unravel(i, shape, idx)
		j := 0
		for d, p := range perm {
			j += idx[d] * inSt[p]
		}
		copyElem(out, i, x, j)
	}
	return []Tensor{out}, nil
}

// axesInput is the int64 axes of input i, or of attribute "axes" (older
// opsets), or nil if neither is given.
func (n *node) axesInput(i int) ([]int64, error) {
	if t := n.optional(i); t != nil {
		return t.ints()
	}
	axes, _ := n.attrInts("axes")
	return axes, nil
}

func unsqueezeOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	if err != nil {
		return nil, err
	}
	axes, err := n.axesInput(1)
	if err != nil {
		return nil, err
	}
	r := len(x.Shape) + len(axes)
	insert := make([]bool, r)
	for _, a := range axes {
		ax, err := normAxis(a, r)
		if err != nil {
			return nil, err
		}
		if insert[ax] {
			return nil, fmt.Errorf("axis %d repeated", a)
		}
		insert[ax] = true
	}
	shape := make([]int64, 0, r)
	k := 0
	for i := range r {
		if insert[i] {
			shape = append(shape, 1)
		} else {
			shape = append(shape, x.Shape[k])
			k++
		}
	}
	return []Tensor{withShape(x, shape)}, nil
}

func squeezeOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	if err != nil {
		return nil, err
	}
	axes, err := n.axesInput(1)
	if err != nil {
		return nil, err
	}
	drop := make([]bool, len(x.Shape))
	for _, a := range axes {
		ax, err := normAxis(a, len(x.Shape))
		if err != nil {
			return nil, err
		}
		if x.Shape[ax] != 1 {
			return nil, fmt.Errorf("cannot squeeze axis %d of shape %v", a, x.Shape)
		}
		drop[ax] = true
	}
	shape := []int64{}
	for i, d := range x.Shape {
		if drop[i] || (axes == nil && d == 1) {
			continue
		}
		shape = append(shape, d)
	}
	return []Tensor{withShape(x, shape)}, nil
}

func concatOp(n *node) ([]Tensor, error) {
	if len(n.in) == 0 {
		return nil, fmt.Errorf("takes at least one input")
	}
	first, err := n.input(0)
	if err != nil {
		return nil, err
	}
	axis, err := normAxis(n.attrInt("axis", 0), len(first.Shape))
	if err != nil {
		return nil, err
	}
	shape := append([]int64{}, first.Shape...)
	shape[axis] = 0
	for i := range n.in {
		t, err := n.input(i)
		if err != nil {
			return nil, err
		}
		if t.DType != first.DType || len(t.Shape) != len(first.Shape) {
			return nil, fmt.Errorf("input %d is %s %v, input 0 %s %v", i, t.DType, t.Shape, first.DType, first.Shape)
		}
		for d := range t.Shape {
			if d != axis && t.Shape[d] != first.Shape[d] {
				return nil, fmt.Errorf("input %d has shape %v, input 0 %v (axis %d)", i, t.Shape, first.Shape, axis)
			}
		}
		shape[axis] += t.Shape[axis]
	}
	out := alloc(first.DType, shape)
	outer := numel(shape[:axis])
	inner := numel(shape[axis+1:])
	pos := 0
	for o := range outer {
		for _, t := range n.in {
			chunk := int(t.Shape[axis]) * inner
			for k := range chunk {
				copyElem(out, pos, *t, o*chunk+k)
				pos++
			}
		}
	}
	return []Tensor{out}, nil
}

// sliceAxis copies the index range [start, start+size) of axis.
func sliceAxis(x Tensor, axis int, start, size int64) Tensor {
	shape := append([]int64{}, x.Shape...)
	shape[axis] = size
	out := alloc(x.DType, shape)
	inner := numel(x.Shape[axis+1:])
	outer := numel(x.Shape[:axis])
	pos := 0
	for o := range outer {
		base := (o*int(x.Shape[axis]) + int(start)) * inner
		for k := range int(size) * inner {
			copyElem(out, pos, x, base+k)
			pos++
		}
	}
	return out
}

// splitOp: sizes from input 1 (opset 13) or attribute split, else equal
// parts (the last smaller, opset 18) for as many outputs as the node has.
func splitOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	if err != nil {
		return nil, err
	}
	axis, err := normAxis(n.attrInt("axis", 0), len(x.Shape))
	if err != nil {
		return nil, err
	}
	var sizes []int64
	if t := n.optional(1); t != nil {
		if sizes, err = t.ints(); err != nil {
			return nil, fmt.Errorf("split: %w", err)
		}
	} else if s, ok := n.attrInts("split"); ok {
		sizes = s
	} else {
		parts := int64(n.attrInt("num_outputs", int64(n.nOut)))
		each := (x.Shape[axis] + parts - 1) / parts
		for left := x.Shape[axis]; left > 0; left -= each {
			sizes = append(sizes, min(each, left))
		}
	}
	var total int64
	for _, s := range sizes {
		if s < 0 {
			return nil, fmt.Errorf("negative split size in %v", sizes)
		}
		total += s
	}
	if total != x.Shape[axis] || len(sizes) != n.nOut {
		return nil, fmt.Errorf("sizes %v for axis %d of shape %v into %d outputs", sizes, axis, x.Shape, n.nOut)
	}
	outs := make([]Tensor, len(sizes))
	var start int64
	for i, s := range sizes {
		outs[i] = sliceAxis(x, axis, start, s)
		start += s
	}
	return outs, nil
}

// sliceOp: starts, ends, optional axes and steps (opset 10+), clamped as
// ONNX specifies.
func sliceOp(n *node) ([]Tensor, error) {
	if err := n.inputs(3, 5); err != nil {
		return nil, err
	}
	x := *n.in[0]
	starts, err := n.in[1].ints()
	if err != nil {
		return nil, fmt.Errorf("starts: %w", err)
	}
	ends, err := n.in[2].ints()
	if err != nil {
		return nil, fmt.Errorf("ends: %w", err)
	}
	if len(starts) != len(ends) {
		return nil, fmt.Errorf("%d starts, %d ends", len(starts), len(ends))
	}
	r := len(x.Shape)
	axes := make([]int64, len(starts))
	for i := range axes {
		axes[i] = int64(i)
	}
	if t := n.optional(3); t != nil {
		if axes, err = t.ints(); err != nil {
			return nil, fmt.Errorf("axes: %w", err)
		}
	}
	steps := make([]int64, len(starts))
	for i := range steps {
		steps[i] = 1
	}
	if t := n.optional(4); t != nil {
		if steps, err = t.ints(); err != nil {
			return nil, fmt.Errorf("steps: %w", err)
		}
	}
	if len(axes) != len(starts) || len(steps) != len(starts) {
		return nil, fmt.Errorf("starts, ends, axes, steps of lengths %d, %d, %d, %d", len(starts), len(ends), len(axes), len(steps))
	}
	first := make([]int64, r)
	step := make([]int64, r)
	shape := append([]int64{}, x.Shape...)
	for i := range step {
		step[i] = 1
	}
	for i, a := range axes {
		ax, err := normAxis(a, r)
		if err != nil {
			return nil, err
		}
		d, s := x.Shape[ax], steps[i]
		if s == 0 {
			return nil, fmt.Errorf("step 0 on axis %d", a)
		}
		st, en := starts[i], ends[i]
		if st < 0 {
			st += d
		}
		if en < 0 {
			en += d
		}
		var count int64
		if s > 0 {
			st, en = min(max(st, 0), d), min(max(en, 0), d)
			if en > st {
				count = (en - st + s - 1) / s
			}
		} else {
			st, en = min(max(st, 0), d-1), min(max(en, -1), d-1)
			if st > en {
				count = (st - en - s - 1) / -s
			}
		}
		first[ax], step[ax], shape[ax] = st, s, count
	}
	out := alloc(x.DType, shape)
	inSt := strides(x.Shape)
	idx := make([]int, r)
	for i := range out.Len() {
		unravel(i, shape, idx)
		j := 0
		for d := range r {
			j += (int(first[d]) + idx[d]*int(step[d])) * inSt[d]
		}
		copyElem(out, i, x, j)
	}
	return []Tensor{out}, nil
}

// expandOp broadcasts x with the given shape (either may be larger).
func expandOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 2); err != nil {
		return nil, err
	}
	x := *n.in[0]
	to, err := n.in[1].ints()
	if err != nil {
		return nil, fmt.Errorf("shape: %w", err)
	}
	shape, err := broadcastShape(x.Shape, to)
	if err != nil {
		return nil, err
	}
	out := alloc(x.DType, shape)
	for i, j := range broadcastIndex(shape, x.Shape) {
		copyElem(out, i, x, j)
	}
	return []Tensor{out}, nil
}

func tileOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 2); err != nil {
		return nil, err
	}
	x := *n.in[0]
	reps, err := n.in[1].ints()
	if err != nil {
		return nil, fmt.Errorf("repeats: %w", err)
	}
	if len(reps) != len(x.Shape) {
		return nil, fmt.Errorf("%d repeats for rank %d", len(reps), len(x.Shape))
	}
	shape := make([]int64, len(reps))
	for i, r := range reps {
		if r < 0 {
			return nil, fmt.Errorf("negative repeat %d", r)
		}
		shape[i] = x.Shape[i] * r
	}
	out := alloc(x.DType, shape)
	inSt := strides(x.Shape)
	idx := make([]int, len(shape))
	for i := range out.Len() {
		unravel(i, shape, idx)
		j := 0
		for d := range idx {
			j += (idx[d] % int(x.Shape[d])) * inSt[d]
		}
		copyElem(out, i, x, j)
	}
	return []Tensor{out}, nil
}

func constantOp(n *node) ([]Tensor, error) {
	if len(n.attrs) != 1 {
		return nil, fmt.Errorf("needs exactly one value attribute, has %d", len(n.attrs))
	}
	for name, a := range n.attrs {
		switch name {
		case "value":
			return one(FromProto(a.GetT()))
		case "value_float":
			return []Tensor{Floats([]int64{}, a.GetF())}, nil
		case "value_floats":
			return []Tensor{Floats([]int64{int64(len(a.GetFloats()))}, append([]float32{}, a.GetFloats()...)...)}, nil
		case "value_int":
			return []Tensor{Ints([]int64{}, a.GetI())}, nil
		case "value_ints":
			return []Tensor{Ints([]int64{int64(len(a.GetInts()))}, append([]int64{}, a.GetInts()...)...)}, nil
		default:
			return nil, fmt.Errorf("value attribute %q is not supported", name)
		}
	}
	panic("unreachable")
}

func constantOfShapeOp(n *node) ([]Tensor, error) {
	s, err := n.input(0)
	if err != nil {
		return nil, err
	}
	shape, err := s.ints()
	if err != nil {
		return nil, fmt.Errorf("shape: %w", err)
	}
	value := Floats([]int64{1}, 0)
	if a, ok := n.attrs["value"]; ok {
		if value, err = FromProto(a.GetT()); err != nil {
			return nil, err
		}
		if value.Len() != 1 {
			return nil, fmt.Errorf("value has %d elements, want 1", value.Len())
		}
	}
	out := alloc(value.DType, append([]int64{}, shape...))
	for i := range out.Len() {
		copyElem(out, i, value, 0)
	}
	return []Tensor{out}, nil
}

func rangeOp(n *node) ([]Tensor, error) {
	if err := n.inputs(3, 3); err != nil {
		return nil, err
	}
	start, limit, delta := *n.in[0], *n.in[1], *n.in[2]
	if err := sameType(start, limit, delta); err != nil {
		return nil, err
	}
	for _, t := range []Tensor{start, limit, delta} {
		if t.Len() != 1 {
			return nil, fmt.Errorf("inputs must be scalars, got shape %v", t.Shape)
		}
	}
	if isInt(start.DType) {
		s, l, d := start.I[0], limit.I[0], delta.I[0]
		if d == 0 {
			return nil, fmt.Errorf("delta 0")
		}
		count := max(int64(math.Ceil(float64(l-s)/float64(d))), 0)
		out := alloc(start.DType, []int64{count})
		for i := range out.I {
			out.I[i] = s + int64(i)*d
		}
		return []Tensor{out}, nil
	}
	s, l, d := start.F[0], limit.F[0], delta.F[0]
	if d == 0 {
		return nil, fmt.Errorf("delta 0")
	}
	count := max(int64(math.Ceil(float64(l-s)/float64(d))), 0)
	out := alloc(start.DType, []int64{count})
	for i := range out.F {
		out.F[i] = s + float32(i)*d
	}
	return []Tensor{out}, nil
}

// convert casts x to dt: float to integer truncates toward zero, anything
// to bool is "not zero".
func convert(x Tensor, dt DType) (Tensor, error) {
	if !supported(dt) {
		return Tensor{}, fmt.Errorf("cast to %s is not supported", dt)
	}
	out := alloc(dt, append([]int64{}, x.Shape...))
	for i := range x.Len() {
		switch {
		case isFloat(dt):
			if x.F != nil {
				out.F[i] = x.F[i]
			} else {
				out.F[i] = float32(x.float64At(i))
			}
		case isInt(dt):
			if x.I != nil {
				out.I[i] = x.I[i]
			} else {
				out.I[i] = int64(x.float64At(i))
			}
			out.I[i] = wrapInt(out.I[i], dt)
		default:
			out.B[i] = x.float64At(i) != 0
		}
	}
	out.round()
	return out, nil
}

// wrapInt wraps v to the range of a narrower integer type.
func wrapInt(v int64, dt DType) int64 {
	switch dt {
	case onnxpb.TensorProto_INT8:
		return int64(int8(v))
	case onnxpb.TensorProto_UINT8:
		return int64(uint8(v))
	case onnxpb.TensorProto_INT16:
		return int64(int16(v))
	case onnxpb.TensorProto_UINT16:
		return int64(uint16(v))
	case Int32:
		return int64(int32(v))
	case onnxpb.TensorProto_UINT32:
		return int64(uint32(v))
	}
	return v
}

func castOp(n *node) ([]Tensor, error) {
	x, err := n.input(0)
	if err != nil {
		return nil, err
	}
	if _, ok := n.attrs["to"]; !ok {
		return nil, fmt.Errorf("attribute to is required")
	}
	return one(convert(x, DType(n.attrInt("to", 0))))
}

func castLikeOp(n *node) ([]Tensor, error) {
	if err := n.inputs(2, 2); err != nil {
		return nil, err
	}
	return one(convert(*n.in[0], n.in[1].DType))
}
