// Package weight writes weight expressions for bindings: a leaf names a
// checkpoint tensor (with the shape the plugin expects it to have), other
// nodes transform tensors. The host lowers an expression into graph nodes
// over the checkpoint's tensors, or computes it (--weights materialize);
// both give the same bits. See WeightBinding and Weight in
// sdk/proto/pluginv1/plugin.proto for the vocabulary.
//
// Because every leaf carries its expected shape, one expression is both the
// binding and what the plugin's check expects of the checkpoint.
package weight

import (
	"github.com/strata-llm/strata/sdk"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// Expr is a weight expression and the tensors its leaves expect.
type Expr struct {
	w      *pb.Weight
	leaves []sdk.ExpectedTensor
}

// Tensor is checkpoint tensor key as stored, expected of shape.
func Tensor(key string, shape ...int64) Expr {
	return Expr{w: &pb.Weight{Key: key}, leaves: []sdk.ExpectedTensor{{Key: key, Shape: shape}}}
}

// Proto is the expression as the contract carries it.
func (e Expr) Proto() *pb.Weight { return e.w }

// Leaves are the checkpoint tensors the expression reads, in order, with
// their expected shapes (shared with the expressions built on e: read, do
// not modify).
func (e Expr) Leaves() []sdk.ExpectedTensor { return e.leaves }

// Key is the tensor of a leaf expression ("" for a transform).
func (e Expr) Key() string { return e.w.GetKey() }

func apply(op string, args []Expr, set func(w *pb.Weight)) Expr {
	out := Expr{w: &pb.Weight{Op: op, Args: make([]*pb.Weight, len(args))}}
	if len(args) == 1 {
		// One operand's leaves are the result's: shared, not copied (a
		// transpose of Kimi-K2's 384 stacked experts per layer).
		out.leaves = args[0].leaves
	} else {
		n := 0
		for _, a := range args {
			n += len(a.leaves)
		}
		out.leaves = make([]sdk.ExpectedTensor, 0, n)
	}
	for i, a := range args {
		out.w.Args[i] = a.w
		if len(args) > 1 {
			out.leaves = append(out.leaves, a.leaves...)
		}
	}
	if set != nil {
		set(out.w)
	}
	return out
}

// Cast converts e to dtype (float32, float16, bfloat16).
func Cast(e Expr, dtype string) Expr {
	return apply("cast", []Expr{e}, func(w *pb.Weight) { w.To = dtype })
}

// Transpose permutes e's axes.
func Transpose(e Expr, perm ...int64) Expr {
	return apply("transpose", []Expr{e}, func(w *pb.Weight) { w.Ints = perm })
}

// Reshape gives e a new shape of as many elements.
func Reshape(e Expr, shape ...int64) Expr {
	return apply("reshape", []Expr{e}, func(w *pb.Weight) { w.Ints = shape })
}

// Stack joins same-shaped expressions along a new axis (per-expert tensors
// into one [E, ...] tensor, in the order given).
func Stack(axis int64, es ...Expr) Expr {
	return apply("stack", es, func(w *pb.Weight) { w.Axis = axis })
}

// Concat joins expressions along an existing axis.
func Concat(axis int64, es ...Expr) Expr {
	return apply("concat", es, func(w *pb.Weight) { w.Axis = axis })
}

// Slice takes start, start+step, ... below end (0: the end) on axis: step 1
// for contiguous halves of a fused tensor, 2 for interleaved ones.
func Slice(e Expr, axis, start, end, step int64) Expr {
	return apply("slice", []Expr{e}, func(w *pb.Weight) { w.Axis, w.Start, w.End, w.Step = axis, start, end, step })
}

// MXFP4 dequantises U8 blocks [..., G, 16] with U8 scales [..., G] into
// float32 [..., G*32] (gpt-oss experts).
func MXFP4(blocks, scales Expr) Expr { return apply("mxfp4_dequant", []Expr{blocks, scales}, nil) }

// FP8 dequantises an F8_E4M3 (or E5M2) weight with its scale: one value, or
// one per block (weight_scale_inv), into float32.
func FP8(weight, scale Expr) Expr { return apply("fp8_dequant", []Expr{weight, scale}, nil) }

// Bind binds formal input to e, in the compute dtype: the tensor as stored
// when e is a leaf, else the expression.
func Bind(input string, e Expr) *pb.WeightBinding {
	if k := e.Key(); k != "" {
		return &pb.WeightBinding{Input: input, Key: k}
	}
	return &pb.WeightBinding{Input: input, Weight: e.w}
}
