package refeval

import (
	"fmt"
)

// Indexing ops: Gather*, Scatter*. Negative indices count from the end;
// out-of-range indices are errors.

func init() {
	register(map[string]opFunc{
		"Gather":          gatherOp,
		"GatherElements":  gatherElementsOp,
		"GatherND":        gatherNDOp,
		"ScatterElements": scatterElementsOp,
		"ScatterND":       scatterNDOp,
	})
}

func index(i, dim int64) (int, error) {
	if i < -dim || i >= dim {
		return 0, fmt.Errorf("index %d out of range for dimension %d", i, dim)
	}
	if i < 0 {
		i += dim
	}
	return int(i), nil
}

func dataAndIndices(n *node, count int) (Tensor, []int64, Tensor, error) {
	if err := n.inputs(count, count); err != nil {
		return Tensor{}, nil, Tensor{}, err
	}
	idx, err := n.in[1].ints()
	if err != nil {
		return Tensor{}, nil, Tensor{}, fmt.Errorf("indices: %w", err)
	}
	return *n.in[0], idx, *n.in[1], nil
}

func gatherOp(n *node) ([]Tensor, error) {
	data, idx, indices, err := dataAndIndices(n, 2)
	if err != nil {
		return nil, err
	}
	axis, err := normAxis(n.attrInt("axis", 0), len(data.Shape))
	if err != nil {
		return nil, err
	}
	shape := append(append(append([]int64{}, data.Shape[:axis]...), indices.Shape...), data.Shape[axis+1:]...)
	out := alloc(data.DType, shape)
	outer, inner := numel(data.Shape[:axis]), numel(data.Shape[axis+1:])
	dim := data.Shape[axis]
	pos := 0
	for o := range outer {
		for _, i := range idx {
			k, err := index(i, dim)
			if err != nil {
				return nil, err
			}
			for j := range inner {
				copyElem(out, pos, data, (o*int(dim)+k)*inner+j)
				pos++
			}
		}
	}
	return []Tensor{out}, nil
}

// elementsAt maps each element of indices (shape of indices, same rank as
// data) to a flat offset of data, its axis coordinate replaced by the index.
func elementsAt(data Tensor, idx []int64, shape []int64, axis int) ([]int, error) {
	if len(shape) != len(data.Shape) {
		return nil, fmt.Errorf("indices of rank %d for data of rank %d", len(shape), len(data.Shape))
	}
	st := strides(data.Shape)
	c := make([]int, len(shape))
	res := make([]int, len(idx))
	for i, v := range idx {
		unravel(i, shape, c)
		k, err := index(v, data.Shape[axis])
		if err != nil {
			return nil, err
		}
		c[axis] = k
		off := 0
		for d := range c {
			if d != axis && c[d] >= int(data.Shape[d]) {
				return nil, fmt.Errorf("indices shape %v exceeds data shape %v", shape, data.Shape)
			}
			off += c[d] * st[d]
		}
		res[i] = off
	}
	return res, nil
}

func gatherElementsOp(n *node) ([]Tensor, error) {
	data, idx, indices, err := dataAndIndices(n, 2)
	if err != nil {
		return nil, err
	}
	axis, err := normAxis(n.attrInt("axis", 0), len(data.Shape))
	if err != nil {
		return nil, err
	}
	at, err := elementsAt(data, idx, indices.Shape, axis)
	if err != nil {
		return nil, err
	}
	out := alloc(data.DType, append([]int64{}, indices.Shape...))
	for i, j := range at {
		copyElem(out, i, data, j)
	}
	return []Tensor{out}, nil
}

// combine applies a scatter reduction to element i of out with v's j.
func combine(out Tensor, i int, v Tensor, j int, reduction string) error {
	if reduction == "none" {
		copyElem(out, i, v, j)
		return nil
	}
	var err error
	switch {
	case out.F != nil:
		out.F[i], err = reduce(out.F[i], v.F[j], reduction)
	case out.I != nil:
		out.I[i], err = reduce(out.I[i], v.I[j], reduction)
	default:
		err = fmt.Errorf("reduction %q on bool", reduction)
	}
	return err
}

func reduce[T float32 | int64](a, b T, reduction string) (T, error) {
	switch reduction {
	case "add":
		return a + b, nil
	case "mul":
		return a * b, nil
	case "max":
		return max(a, b), nil
	case "min":
		return min(a, b), nil
	default:
		return a, fmt.Errorf("reduction %q is not supported", reduction)
	}
}

func scatterElementsOp(n *node) ([]Tensor, error) {
	data, idx, indices, err := dataAndIndices(n, 3)
	if err != nil {
		return nil, err
	}
	updates := *n.in[2]
	if updates.DType != data.DType {
		return nil, fmt.Errorf("updates of type %s for data of type %s", updates.DType, data.DType)
	}
	if !equalShape(updates.Shape, indices.Shape) {
		return nil, fmt.Errorf("updates shape %v, indices shape %v", updates.Shape, indices.Shape)
	}
	axis, err := normAxis(n.attrInt("axis", 0), len(data.Shape))
	if err != nil {
		return nil, err
	}
	at, err := elementsAt(data, idx, indices.Shape, axis)
	if err != nil {
		return nil, err
	}
	out := clone(data)
	reduction := n.attrString("reduction", "none")
	for i, j := range at {
		if err := combine(out, j, updates, i, reduction); err != nil {
			return nil, err
		}
	}
	return []Tensor{out}, nil
}

// ndOffsets reads index tuples of length m from the last axis of indices
// into data whose first batch dims are batch dims, returning for each tuple
// the flat offset of the slice it addresses and the slice size.
func ndOffsets(data Tensor, idx []int64, ishape []int64, batch int) ([]int, int, error) {
	q := len(ishape)
	if q < 1 || batch >= q || batch > len(data.Shape) {
		return nil, 0, fmt.Errorf("indices shape %v, batch_dims %d, data shape %v", ishape, batch, data.Shape)
	}
	m := int(ishape[q-1])
	if batch+m > len(data.Shape) {
		return nil, 0, fmt.Errorf("index tuples of length %d into data of rank %d with batch_dims %d", m, len(data.Shape), batch)
	}
	for d := range batch {
		if ishape[d] != data.Shape[d] {
			return nil, 0, fmt.Errorf("batch dimensions of indices %v and data %v differ", ishape, data.Shape)
		}
	}
	st := strides(data.Shape)
	slice := numel(data.Shape[batch+m:])
	tuples := numel(ishape[:q-1])
	perBatch := numel(ishape[batch : q-1])
	batchStride := 1
	if batch > 0 {
		batchStride = st[batch-1]
	}
	offs := make([]int, tuples)
	for t := range tuples {
		off := (t / perBatch) * batchStride
		if batch == 0 {
			off = 0
		}
		for k := range m {
			j, err := index(idx[t*m+k], data.Shape[batch+k])
			if err != nil {
				return nil, 0, err
			}
			off += j * st[batch+k]
		}
		offs[t] = off
	}
	return offs, slice, nil
}

func gatherNDOp(n *node) ([]Tensor, error) {
	data, idx, indices, err := dataAndIndices(n, 2)
	if err != nil {
		return nil, err
	}
	batch := int(n.attrInt("batch_dims", 0))
	offs, slice, err := ndOffsets(data, idx, indices.Shape, batch)
	if err != nil {
		return nil, err
	}
	q := len(indices.Shape)
	m := int(indices.Shape[q-1])
	shape := append(append([]int64{}, indices.Shape[:q-1]...), data.Shape[batch+m:]...)
	out := alloc(data.DType, shape)
	for t, off := range offs {
		for k := range slice {
			copyElem(out, t*slice+k, data, off+k)
		}
	}
	return []Tensor{out}, nil
}

func scatterNDOp(n *node) ([]Tensor, error) {
	data, idx, indices, err := dataAndIndices(n, 3)
	if err != nil {
		return nil, err
	}
	updates := *n.in[2]
	if updates.DType != data.DType {
		return nil, fmt.Errorf("updates of type %s for data of type %s", updates.DType, data.DType)
	}
	offs, slice, err := ndOffsets(data, idx, indices.Shape, 0)
	if err != nil {
		return nil, err
	}
	q := len(indices.Shape)
	m := int(indices.Shape[q-1])
	want := append(append([]int64{}, indices.Shape[:q-1]...), data.Shape[m:]...)
	if !equalShape(updates.Shape, want) {
		return nil, fmt.Errorf("updates shape %v, want %v", updates.Shape, want)
	}
	out := clone(data)
	reduction := n.attrString("reduction", "none")
	for t, off := range offs {
		for k := range slice {
			if err := combine(out, off+k, updates, t*slice+k, reduction); err != nil {
				return nil, err
			}
		}
	}
	return []Tensor{out}, nil
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
