// Package transform is the vocabulary that turns checkpoint tensors into the
// weights a graph wants — cast, transpose, reshape, stack, concat, slice,
// mxfp4_dequant, fp8_dequant — with two lowerings that give the same bits:
// ONNX nodes over the referenced tensors (Lower) and a Go computation over
// their bytes (Eval).
package transform

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// Operations.
const (
	OpCast      = "cast"
	OpTranspose = "transpose"
	OpReshape   = "reshape"
	OpStack     = "stack"
	OpConcat    = "concat"
	OpSlice     = "slice"
	OpMXFP4     = "mxfp4_dequant"
	OpFP8       = "fp8_dequant" // dequant of an FP8 weight: the name the SDK's weight.FP8 writes
	OpDequant   = "dequant"
	OpUnpackInt = "unpack_int"
	OpUnpackFP4 = "unpack_fp4"
	OpMul       = "mul"
	OpDiv       = "div"
)

// Type is a tensor's element type and shape.
type Type struct {
	DType dtype.DType
	Shape []int64
}

// Elements is the number of elements.
func (t Type) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Bytes is the size of the data.
func (t Type) Bytes() int64 {
	info, _ := dtype.Of(t.DType)
	return info.ByteSize(t.Elements())
}

func (t Type) String() string {
	return fmt.Sprintf("%s%v", dtype.Name(t.DType), t.Shape)
}

// Expr is a weight expression: a checkpoint tensor (Key) or Op over Args.
// Infer fills Type on every node.
type Expr struct {
	Key  string  `json:"key,omitempty"`
	Op   string  `json:"op,omitempty"`
	Args []*Expr `json:"args,omitempty"`
	// Parameters, by op: Ints (transpose perm, reshape shape, dequant
	// block, unpack_int [bits, offset]), Axis (stack, concat, slice,
	// unpack_int), Start/End/Step (slice; End: unpack_int's unpacked
	// length), To (cast).
	Ints  []int64 `json:"ints,omitempty"`
	Axis  int64   `json:"axis,omitempty"`
	Start int64   `json:"start,omitempty"`
	End   int64   `json:"end,omitempty"`
	Step  int64   `json:"step,omitempty"`
	To    string  `json:"to,omitempty"`

	Type Type `json:"-"`
	// Stored is the checkpoint tensor a leaf names, once InferStored found
	// it: what follows (lowering, the spec's sources) needs no lookup by
	// key (four per leaf of Kimi-K2's 139,000: Checkpoint.Tensor was 5%
	// of its export's CPU).
	Stored *checkpoint.Tensor `json:"-"`
}

// Leaf is the checkpoint tensor key, as stored.
func Leaf(key string) *Expr { return &Expr{Key: key} }

// Cast wraps e in a cast to dtype to (a user-facing name).
func Cast(e *Expr, to string) *Expr { return &Expr{Op: OpCast, Args: []*Expr{e}, To: to} }

// FromProto converts a plugin's weight expression.
func FromProto(w *pb.Weight) (*Expr, error) {
	if w == nil {
		return nil, fmt.Errorf("empty weight expression")
	}
	if (w.GetKey() == "") == (w.GetOp() == "") {
		return nil, fmt.Errorf("a weight expression names either a key or an op, not %s", describe(w))
	}
	e := &Expr{Key: w.GetKey(), Op: w.GetOp(), Ints: w.GetInts(), Axis: w.GetAxis(),
		Start: w.GetStart(), End: w.GetEnd(), Step: w.GetStep(), To: w.GetTo()}
	for _, a := range w.GetArgs() {
		arg, err := FromProto(a)
		if err != nil {
			return nil, err
		}
		e.Args = append(e.Args, arg)
	}
	return e, nil
}

func describe(w *pb.Weight) string {
	return fmt.Sprintf("key %q op %q", w.GetKey(), w.GetOp())
}

// IsLeaf reports whether e is a checkpoint tensor as stored.
func (e *Expr) IsLeaf() bool { return e.Op == "" }

// Keys lists the checkpoint tensors e reads, in order, each once.
func (e *Expr) Keys() []string {
	var keys []string
	var seen map[string]bool // past a few keys (a stack of experts): a scan per leaf was quadratic
	e.walk(func(x *Expr) {
		switch {
		case !x.IsLeaf():
		case seen != nil:
			if !seen[x.Key] {
				seen[x.Key] = true
				keys = append(keys, x.Key)
			}
		case !slices.Contains(keys, x.Key):
			keys = append(keys, x.Key)
			if len(keys) == 16 {
				seen = make(map[string]bool, 64)
				for _, k := range keys {
					seen[k] = true
				}
			}
		}
	})
	return keys
}

// EachLeaf calls fn with the key of every leaf, in order, repeats included:
// Keys without its list, for a stack of 512 experts visited per binding.
func (e *Expr) EachLeaf(fn func(key string)) {
	e.walk(func(x *Expr) {
		if x.IsLeaf() {
			fn(x.Key)
		}
	})
}

// EachLeafExpr calls fn with each leaf node, in order.
func (e *Expr) EachLeafExpr(fn func(*Expr)) {
	e.walk(func(x *Expr) {
		if x.IsLeaf() {
			fn(x)
		}
	})
}

func (e *Expr) walk(fn func(*Expr)) {
	fn(e)
	for _, a := range e.Args {
		a.walk(fn)
	}
}

// Digest is the SHA-256 of e's canonical encoding: two expressions have the
// same digest exactly when they compute the same thing from the same
// tensors. A table of 73,000 weights keys on it, not on the encodings (6 MB).
func (e *Expr) Digest() [sha256.Size]byte {
	d, _ := e.AppendDigest(nil)
	return d
}

// AppendDigest is Digest with scratch space for the encoding, returned
// for the next call (a stack of 160 experts encodes to 20 kB).
func (e *Expr) AppendDigest(scratch []byte) ([sha256.Size]byte, []byte) {
	scratch = e.appendCanonical(scratch[:0])
	return sha256.Sum256(scratch), scratch
}

// appendCanonical writes every field in a fixed order, each string and
// list prefixed by its length, so that no two expressions share an
// encoding. (Quoting the strings instead was 3% of GLM-4.6-FP8's export.)
func (e *Expr) appendCanonical(b []byte) []byte {
	b = appendString(b, e.Key)
	b = appendString(b, e.Op)
	b = binary.AppendUvarint(b, uint64(len(e.Ints)))
	for _, v := range e.Ints {
		b = binary.AppendVarint(b, v)
	}
	for _, v := range [...]int64{e.Axis, e.Start, e.End, e.Step} {
		b = binary.AppendVarint(b, v)
	}
	b = appendString(b, e.To)
	b = binary.AppendUvarint(b, uint64(len(e.Args)))
	for _, a := range e.Args {
		b = a.appendCanonical(b)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// String is a short human description: op(args) with keys abbreviated.
func (e *Expr) String() string {
	if e.IsLeaf() {
		return e.Key
	}
	args := make([]string, len(e.Args))
	for i, a := range e.Args {
		args[i] = a.String()
	}
	if len(args) > 3 {
		args = append(args[:2], fmt.Sprintf("... %d more", len(args)-2))
	}
	return fmt.Sprintf("%s(%s)", e.Op, strings.Join(args, ", "))
}

// Lookup gives the stored type of a checkpoint tensor.
type Lookup func(key string) (Type, error)

// TypeOf is a stored tensor's type (its dtype validated when the header
// was read).
func TypeOf(t *checkpoint.Tensor) Type {
	info, _ := dtype.FromSafetensors(t.DType)
	return Type{DType: info.ONNX, Shape: t.Shape}
}

// Find gives the checkpoint tensor of a key, and its type.
type Find func(key string) (*checkpoint.Tensor, Type, error)

// Infer checks e against the stored tensors and fills every node's Type.
// Errors name the operation and what is wrong.
func (e *Expr) Infer(lookup Lookup) error { return e.infer(typeOnly(lookup), true) }

// InferStored is Infer that also records each leaf's tensor (Stored).
func (e *Expr) InferStored(find Find) error { return e.infer(find, true) }

// InferNew types the nodes of e not yet typed (those a rewrite such as
// HoistDequant or a Cast added above typed nodes, which keep their types):
// a stack of 160 experts is not looked up again node by node.
func (e *Expr) InferNew(lookup Lookup) error { return e.infer(typeOnly(lookup), false) }

func typeOnly(lookup Lookup) Find {
	return func(key string) (*checkpoint.Tensor, Type, error) {
		t, err := lookup(key)
		return nil, t, err
	}
}

func (e *Expr) infer(find Find, all bool) error {
	typed := !all && e.Type.DType != 0
	if e.IsLeaf() {
		if typed {
			return nil
		}
		stored, t, err := find(e.Key)
		if err != nil {
			return err
		}
		e.Type, e.Stored = t, stored
		return nil
	}
	// A typed node may have new children (HoistDequant replaces them in
	// place): they are typed even when it is.
	for _, a := range e.Args {
		if err := a.infer(find, all); err != nil {
			return err
		}
	}
	if typed {
		return nil
	}
	rule, ok := rules[e.Op]
	if !ok {
		return fmt.Errorf("unknown weight transform %q (known: %s)", e.Op, strings.Join(opNames(), ", "))
	}
	if len(e.Args) < rule.minArgs || rule.maxArgs > 0 && len(e.Args) > rule.maxArgs {
		return fmt.Errorf("%s takes %s, got %d", e.Op, rule.argsText(), len(e.Args))
	}
	t, err := rule.infer(e)
	if err != nil {
		return fmt.Errorf("%s: %w", e, err)
	}
	e.Type = t
	return nil
}

type rule struct {
	minArgs, maxArgs int // maxArgs 0: no limit
	infer            func(*Expr) (Type, error)
}

func (r rule) argsText() string {
	switch {
	case r.maxArgs == 0:
		return fmt.Sprintf("at least %d arguments", r.minArgs)
	case r.minArgs == r.maxArgs:
		return fmt.Sprintf("%d argument(s)", r.minArgs)
	default:
		return fmt.Sprintf("%d to %d arguments", r.minArgs, r.maxArgs)
	}
}

var rules map[string]rule

func init() {
	rules = map[string]rule{
		OpCast:      {1, 1, inferCast},
		OpTranspose: {1, 1, inferTranspose},
		OpReshape:   {1, 1, inferReshape},
		OpStack:     {1, 0, inferStack},
		OpConcat:    {1, 0, inferConcat},
		OpSlice:     {1, 1, inferSlice},
		OpMXFP4:     {2, 2, inferMXFP4},
		OpFP8:       {2, 3, inferDequant},
		OpDequant:   {2, 3, inferDequant},
		OpUnpackInt: {1, 1, inferUnpackInt},
		OpUnpackFP4: {1, 1, inferUnpackFP4},
		OpMul:       {2, 2, inferScalarArith},
		OpDiv:       {2, 2, inferScalarArith},
	}
}

func opNames() []string {
	names := make([]string, 0, len(rules))
	for n := range rules {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Float element types a cast reads or writes.
var castTargets = []dtype.DType{onnxpb.TensorProto_FLOAT, onnxpb.TensorProto_FLOAT16, onnxpb.TensorProto_BFLOAT16}

func inferCast(e *Expr) (Type, error) {
	to, err := dtype.Parse(e.To)
	if err != nil || !slices.Contains(castTargets, to) {
		return Type{}, fmt.Errorf("cast to %q: use float32, float16 or bfloat16", e.To)
	}
	src := e.Args[0].Type
	if !isFloat(src.DType) {
		return Type{}, fmt.Errorf("a %s tensor cannot be cast to %s: it is quantised or packed and needs its dequantising transform (with its scales), never a plain cast", dtype.Name(src.DType), e.To)
	}
	return Type{to, src.Shape}, nil
}

func inferTranspose(e *Expr) (Type, error) {
	src := e.Args[0].Type
	if len(e.Ints) != len(src.Shape) {
		return Type{}, fmt.Errorf("permutation %v for a rank-%d tensor", e.Ints, len(src.Shape))
	}
	shape := make([]int64, len(src.Shape))
	seen := make([]bool, len(src.Shape))
	for i, p := range e.Ints {
		if p < 0 || int(p) >= len(src.Shape) || seen[p] {
			return Type{}, fmt.Errorf("%v is not a permutation of 0..%d", e.Ints, len(src.Shape)-1)
		}
		seen[p] = true
		shape[i] = src.Shape[p]
	}
	return Type{src.DType, shape}, nil
}

func inferReshape(e *Expr) (Type, error) {
	src := e.Args[0].Type
	n := int64(1)
	for _, d := range e.Ints {
		if d <= 0 {
			return Type{}, fmt.Errorf("shape %v: every dimension must be positive", e.Ints)
		}
		n *= d
	}
	if n != src.Elements() {
		return Type{}, fmt.Errorf("cannot reshape %v (%d elements) to %v (%d)", src.Shape, src.Elements(), e.Ints, n)
	}
	return Type{src.DType, e.Ints}, nil
}

// sameArgs requires every argument to have the first's dtype, and returns it.
func sameArgs(e *Expr) (Type, error) {
	first := e.Args[0].Type
	for i, a := range e.Args[1:] {
		if a.Type.DType != first.DType {
			return Type{}, fmt.Errorf("argument %d is %s, argument 0 %s", i+1, a.Type, first)
		}
	}
	return first, nil
}

func normAxis(axis int64, rank int) (int64, error) {
	if axis < 0 {
		axis += int64(rank)
	}
	if axis < 0 || axis >= int64(rank) {
		return 0, fmt.Errorf("axis %d out of range for rank %d", axis, rank)
	}
	return axis, nil
}

func inferStack(e *Expr) (Type, error) {
	first, err := sameArgs(e)
	if err != nil {
		return Type{}, err
	}
	for i, a := range e.Args[1:] {
		if !slices.Equal(a.Type.Shape, first.Shape) {
			return Type{}, fmt.Errorf("argument %d has shape %v, argument 0 %v", i+1, a.Type.Shape, first.Shape)
		}
	}
	axis, err := normAxis(e.Axis, len(first.Shape)+1)
	if err != nil {
		return Type{}, err
	}
	e.Axis = axis
	shape := slices.Insert(slices.Clone(first.Shape), int(axis), int64(len(e.Args)))
	return Type{first.DType, shape}, nil
}

func inferConcat(e *Expr) (Type, error) {
	first, err := sameArgs(e)
	if err != nil {
		return Type{}, err
	}
	axis, err := normAxis(e.Axis, len(first.Shape))
	if err != nil {
		return Type{}, err
	}
	e.Axis = axis
	shape := slices.Clone(first.Shape)
	shape[axis] = 0
	for i, a := range e.Args {
		other := slices.Clone(a.Type.Shape)
		if len(other) != len(shape) {
			return Type{}, fmt.Errorf("argument %d has rank %d, argument 0 %d", i, len(other), len(shape))
		}
		shape[axis] += other[axis]
		other[axis] = first.Shape[axis]
		if !slices.Equal(other, first.Shape) {
			return Type{}, fmt.Errorf("argument %d has shape %v, incompatible with %v along axis %d", i, a.Type.Shape, first.Shape, axis)
		}
	}
	return Type{first.DType, shape}, nil
}

func inferSlice(e *Expr) (Type, error) {
	src := e.Args[0].Type
	axis, err := normAxis(e.Axis, len(src.Shape))
	if err != nil {
		return Type{}, err
	}
	e.Axis = axis
	dim := src.Shape[axis]
	if e.Step == 0 {
		e.Step = 1
	}
	if e.End == 0 {
		e.End = dim
	}
	if e.Step < 1 || e.Start < 0 || e.Start >= e.End || e.End > dim {
		return Type{}, fmt.Errorf("slice [%d:%d:%d] of a dimension of %d", e.Start, e.End, e.Step, dim)
	}
	shape := slices.Clone(src.Shape)
	shape[axis] = (e.End - e.Start + e.Step - 1) / e.Step
	return Type{src.DType, shape}, nil
}

func inferMXFP4(e *Expr) (Type, error) {
	blocks, scales := e.Args[0].Type, e.Args[1].Type
	if blocks.DType != onnxpb.TensorProto_UINT8 || !isExponent(scales.DType) {
		return Type{}, fmt.Errorf("needs U8 blocks and U8 (or F8_E8M0) scales, got %s and %s", blocks, scales)
	}
	r := len(blocks.Shape)
	if r < 2 || blocks.Shape[r-1] != 16 || !slices.Equal(blocks.Shape[:r-1], scales.Shape) {
		return Type{}, fmt.Errorf("blocks must be [..., G, 16] and scales [..., G]; got %v and %v", blocks.Shape, scales.Shape)
	}
	shape := slices.Clone(blocks.Shape[:r-1])
	shape[r-2] *= 32
	return Type{onnxpb.TensorProto_FLOAT, shape}, nil
}

func isFloat(t dtype.DType) bool {
	return slices.Contains(castTargets, t) || t == onnxpb.TensorProto_DOUBLE
}

func isFP8(t dtype.DType) bool {
	return t == onnxpb.TensorProto_FLOAT8E4M3FN || t == onnxpb.TensorProto_FLOAT8E5M2 || t == onnxpb.TensorProto_FLOAT8E8M0
}

func isExponent(t dtype.DType) bool {
	return t == onnxpb.TensorProto_UINT8 || t == onnxpb.TensorProto_FLOAT8E8M0
}
