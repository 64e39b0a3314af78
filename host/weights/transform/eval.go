package transform

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/strata-llm/strata/sdk/dtype"
)

// Data is a tensor's bytes, row-major and little-endian.
type Data struct {
	Type  Type
	Bytes []byte
}

// EvalContext is Eval returning as soon as ctx is cancelled: one weight of
// a large model (an embedding cast to float32) can take many seconds. The
// abandoned evaluation only computes in memory and ends with the tensor;
// nothing is written from it.
func (e *Expr) EvalContext(ctx context.Context, read Reader) (Data, error) {
	if err := ctx.Err(); err != nil {
		return Data{}, err
	}
	type result struct {
		data Data
		err  error
	}
	done := make(chan result, 1)
	go func() {
		d, err := e.Eval(read)
		done <- result{d, err}
	}()
	select {
	case r := <-done:
		return r.data, r.err
	case <-ctx.Done():
		return Data{}, ctx.Err()
	}
}

// Reader returns a checkpoint tensor's stored bytes.
type Reader func(key string) ([]byte, error)

// Eval computes e (after Infer) from the stored bytes, in Go: the
// materialised lowering. It holds the arguments of one node and its result
// at a time.
func (e *Expr) Eval(read Reader) (Data, error) {
	if e.IsLeaf() {
		b, err := read(e.Key)
		if err != nil {
			return Data{}, err
		}
		if int64(len(b)) != e.Type.Bytes() {
			return Data{}, fmt.Errorf("tensor %s: read %d bytes, want %d", e.Key, len(b), e.Type.Bytes())
		}
		return Data{e.Type, b}, nil
	}
	args := make([]Data, len(e.Args))
	for i, a := range e.Args {
		var err error
		if args[i], err = a.Eval(read); err != nil {
			return Data{}, err
		}
	}
	out := evals[e.Op](e, args)
	if int64(len(out)) != e.Type.Bytes() {
		return Data{}, fmt.Errorf("%s produced %d bytes, want %d", e, len(out), e.Type.Bytes())
	}
	return Data{e.Type, out}, nil
}

var evals = map[string]func(*Expr, []Data) []byte{
	OpCast:      evalCast,
	OpTranspose: evalTranspose,
	OpReshape:   func(_ *Expr, a []Data) []byte { return a[0].Bytes },
	OpStack:     evalJoin,
	OpConcat:    evalJoin,
	OpSlice:     evalSlice,
	OpMXFP4:     evalMXFP4,
	OpFP8:       evalDequant,
	OpDequant:   evalDequant,
	OpUnpackInt: evalUnpackInt,
	OpUnpackFP4: evalUnpackFP4,
	OpMul:       evalScalarArith,
	OpDiv:       evalScalarArith,
}

func elemSize(t dtype.DType) int {
	info, _ := dtype.Of(t)
	return info.Bits / 8
}

// Prod is the number of elements of a shape.
func Prod(dims []int64) int64 { return prod(dims) }

func prod(dims []int64) int64 {
	n := int64(1)
	for _, d := range dims {
		n *= d
	}
	return n
}

func evalCast(e *Expr, a []Data) []byte { return castBytes(a[0].Type.DType, e.Type.DType, a[0].Bytes) }

func castBytes(from, to dtype.DType, b []byte) []byte {
	if from == to {
		return b
	}
	return fromFloat32(to, toFloat32(from, b))
}

// Parts splits e into expressions whose results, one after another, are e's
// bytes, so a weight can be computed a part at a time: one expert of a stacked
// MoE projection, not the whole stack. A reshape is its argument's parts;
// anything else is its slabs along the first axis (slabs).
func (e *Expr) Parts() []*Expr {
	if e.Op == OpReshape && len(e.Args) == 1 {
		if inner := e.Args[0].Parts(); len(inner) > 1 {
			return inner
		}
		return []*Expr{e}
	}
	return e.slabs()
}

// slabs splits e along its first axis into expressions of shape [k, rest...]
// whose results, in order, are e's: a stack along the first axis is its
// arguments (each [1, ...]), a concat along it its arguments' slabs, and a
// cast, or a transpose that keeps the first axis first, applies to each
// slab. Otherwise e is its one slab.
func (e *Expr) slabs() []*Expr {
	var parts []*Expr
	switch {
	case e.Op == OpStack && e.Axis == 0:
		for _, a := range e.Args {
			shape := append([]int64{1}, a.Type.Shape...)
			parts = append(parts, &Expr{Op: OpReshape, Ints: shape, Args: []*Expr{a}, Type: Type{DType: a.Type.DType, Shape: shape}})
		}
	case e.Op == OpConcat && e.Axis == 0:
		for _, a := range e.Args {
			parts = append(parts, a.slabs()...)
		}
	case e.Op == OpCast && len(e.Args) == 1:
		for _, x := range e.Args[0].slabs() {
			parts = append(parts, &Expr{Op: OpCast, To: e.To, Args: []*Expr{x}, Type: Type{DType: e.Type.DType, Shape: x.Type.Shape}})
		}
	case e.Op == OpTranspose && len(e.Args) == 1 && len(e.Ints) > 0 && e.Ints[0] == 0:
		for _, x := range e.Args[0].slabs() {
			shape := make([]int64, len(e.Ints))
			for i, p := range e.Ints {
				shape[i] = x.Type.Shape[p]
			}
			parts = append(parts, &Expr{Op: OpTranspose, Ints: e.Ints, Args: []*Expr{x}, Type: Type{DType: e.Type.DType, Shape: shape}})
		}
	}
	if len(parts) < 2 {
		return []*Expr{e}
	}
	return parts
}

// ElementwiseLeaf is the tensor e computes element by element, in storage
// order, when e is that tensor itself or casts and reshapes of it: such a
// weight can be computed a slice at a time (EvalElements).
func (e *Expr) ElementwiseLeaf() (*Expr, bool) {
	for x := e; ; x = x.Args[0] {
		if x.IsLeaf() {
			return x, true
		}
		if x.Op != OpCast && x.Op != OpReshape || len(x.Args) != 1 {
			return nil, false
		}
	}
}

// EvalElements computes, for e with an ElementwiseLeaf, the bytes of the
// elements whose stored bytes src holds (a run of whole elements).
func (e *Expr) EvalElements(src []byte) []byte {
	if e.IsLeaf() {
		return src
	}
	in := e.Args[0].EvalElements(src)
	if e.Op == OpReshape {
		return in
	}
	return castBytes(e.Args[0].Type.DType, e.Type.DType, in)
}

func evalTranspose(e *Expr, a []Data) []byte {
	src, size := a[0], int64(elemSize(a[0].Type.DType))
	rank, n := len(src.Type.Shape), src.Type.Elements()
	out := make([]byte, len(src.Bytes))
	if rank == 0 || n == 0 {
		copy(out, src.Bytes)
		return out
	}
	srcStrides := strides(src.Type.Shape)
	// A row of the output (its last axis) reads the source at a fixed stride.
	row := e.Type.Shape[rank-1]
	step := srcStrides[e.Ints[rank-1]] * size
	idx := make([]int64, rank-1) // the output row's index over the other axes
	for o := int64(0); o < n; o += row {
		var s int64
		for i, p := range e.Ints[:rank-1] {
			s += idx[i] * srcStrides[p]
		}
		copyStrided(out[o*size:(o+row)*size], src.Bytes, s*size, step, size)
		for i := rank - 2; i >= 0; i-- { // next output row
			idx[i]++
			if idx[i] < e.Type.Shape[i] {
				break
			}
			idx[i] = 0
		}
	}
	return out
}

// copyStrided fills dst with elements of size bytes read from src at, at+step,
// at+2·step, ...; common sizes move as one load and store.
func copyStrided(dst, src []byte, at, step, size int64) {
	le := binary.LittleEndian
	switch size {
	case 1:
		for j := range dst {
			dst[j] = src[at]
			at += step
		}
	case 2:
		for j := 0; j < len(dst); j += 2 {
			le.PutUint16(dst[j:], le.Uint16(src[at:]))
			at += step
		}
	case 4:
		for j := 0; j < len(dst); j += 4 {
			le.PutUint32(dst[j:], le.Uint32(src[at:]))
			at += step
		}
	default:
		for j := int64(0); j < int64(len(dst)); j += size {
			copy(dst[j:j+size], src[at:at+size])
			at += step
		}
	}
}

func strides(shape []int64) []int64 {
	s := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

// evalJoin stacks (a new axis) or concatenates (an existing one): for each
// index before the axis, each argument contributes its block in turn.
func evalJoin(e *Expr, a []Data) []byte {
	size := int64(elemSize(e.Type.DType))
	outer := prod(e.Type.Shape[:e.Axis])
	out := make([]byte, 0, e.Type.Bytes())
	for o := int64(0); o < outer; o++ {
		for _, arg := range a {
			inner := prod(arg.Type.Shape[e.Axis:]) * size
			out = append(out, arg.Bytes[o*inner:(o+1)*inner]...)
		}
	}
	return out
}

func evalSlice(e *Expr, a []Data) []byte {
	src := a[0]
	size := int64(elemSize(src.Type.DType))
	outer := prod(src.Type.Shape[:e.Axis])
	dim := src.Type.Shape[e.Axis]
	inner := prod(src.Type.Shape[e.Axis+1:]) * size
	out := make([]byte, 0, e.Type.Bytes())
	for o := int64(0); o < outer; o++ {
		for i := e.Start; i < e.End; i += e.Step {
			at := (o*dim + i) * inner
			out = append(out, src.Bytes[at:at+inner]...)
		}
	}
	return out
}

func evalMXFP4(_ *Expr, a []Data) []byte {
	blocks, scales := a[0].Bytes, toFloat32(a[1].Type.DType, a[1].Bytes)
	out := make([]byte, 4*32*len(scales))
	for g, f := range scales {
		for b := range 16 {
			code := blocks[16*g+b]
			binary.LittleEndian.PutUint32(out[4*(32*g+2*b):], math.Float32bits(fp4Values[code&0x0f]*f))
			binary.LittleEndian.PutUint32(out[4*(32*g+2*b+1):], math.Float32bits(fp4Values[code>>4]*f))
		}
	}
	return out
}
