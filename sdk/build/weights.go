package build

import (
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// Weight expressions for bindings: the host lowers them into graph nodes
// over the checkpoint's tensors, or computes them (--weights materialize).
// See WeightBinding and Weight in sdk/proto/pluginv1/plugin.proto.

// Tensor is checkpoint tensor key as stored.
func Tensor(key string) *pb.Weight { return &pb.Weight{Key: key} }

// CastWeight converts w to dtype (float32, float16, bfloat16).
func CastWeight(w *pb.Weight, dtype string) *pb.Weight {
	return &pb.Weight{Op: "cast", Args: []*pb.Weight{w}, To: dtype}
}

// TransposeWeight permutes w's axes.
func TransposeWeight(w *pb.Weight, perm ...int64) *pb.Weight {
	return &pb.Weight{Op: "transpose", Args: []*pb.Weight{w}, Ints: perm}
}

// ReshapeWeight gives w a new shape of as many elements.
func ReshapeWeight(w *pb.Weight, shape ...int64) *pb.Weight {
	return &pb.Weight{Op: "reshape", Args: []*pb.Weight{w}, Ints: shape}
}

// StackWeights joins same-shaped weights along a new axis (per-expert
// tensors into one [E, ...] tensor, in the order given).
func StackWeights(axis int64, ws ...*pb.Weight) *pb.Weight {
	return &pb.Weight{Op: "stack", Args: ws, Axis: axis}
}

// ConcatWeights joins weights along an existing axis.
func ConcatWeights(axis int64, ws ...*pb.Weight) *pb.Weight {
	return &pb.Weight{Op: "concat", Args: ws, Axis: axis}
}

// SliceWeight takes start, start+step, ... below end (0: the end) on axis:
// step 1 for contiguous halves of a fused tensor, 2 for interleaved ones.
func SliceWeight(w *pb.Weight, axis, start, end, step int64) *pb.Weight {
	return &pb.Weight{Op: "slice", Args: []*pb.Weight{w}, Axis: axis, Start: start, End: end, Step: step}
}

// MXFP4Weight dequantises U8 blocks [..., G, 16] with U8 scales [..., G]
// into float32 [..., G*32] (gpt-oss experts).
func MXFP4Weight(blocks, scales *pb.Weight) *pb.Weight {
	return &pb.Weight{Op: "mxfp4_dequant", Args: []*pb.Weight{blocks, scales}}
}

// FP8Weight dequantises an F8_E4M3 (or E5M2) weight with its scale: one
// value, or one per block (weight_scale_inv) — into float32.
func FP8Weight(weight, scale *pb.Weight) *pb.Weight {
	return &pb.Weight{Op: "fp8_dequant", Args: []*pb.Weight{weight, scale}}
}

// BindWeight binds formal input to an expression, in the compute dtype.
func BindWeight(input string, w *pb.Weight) *pb.WeightBinding {
	return &pb.WeightBinding{Input: input, Weight: w}
}
