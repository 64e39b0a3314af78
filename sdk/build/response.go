package build

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/dtype"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// ComputeDType is the compute dtype export options ask for (float32 when unset).
func ComputeDType(opts *pb.ExportOptions) (DType, error) {
	return dtype.ParseCompute(opts.GetComputeDtype())
}

// Response packages a finished part function, the functions it calls and
// its weight bindings.
func Response(f *Func, weights ...*pb.LayerWeights) *pb.BuildResponse {
	return &pb.BuildResponse{Function: f.Proto(), Dependencies: f.Dependencies(), Weights: weights}
}

// Bind lists (formal input, checkpoint key) pairs for one layer, or for
// sdk.NonLayer parts.
func Bind(layer int32, inputKeyPairs ...string) *pb.LayerWeights {
	if len(inputKeyPairs)%2 != 0 {
		panic(fmt.Sprintf("build.Bind: odd number of input/key strings: %q", inputKeyPairs))
	}
	lw := &pb.LayerWeights{Layer: layer}
	for i := 0; i < len(inputKeyPairs); i += 2 {
		lw.Bindings = append(lw.Bindings, &pb.WeightBinding{Input: inputKeyPairs[i], Key: inputKeyPairs[i+1]})
	}
	return lw
}

// DimSize is a fixed dimension of a cache shape.
func DimSize(n int) *pb.Dim { return &pb.Dim{Value: &pb.Dim_Size{Size: int64(n)}} }

// DimParam is a symbolic dimension of a cache shape (batch_size, ctx_len).
func DimParam(name string) *pb.Dim { return &pb.Dim{Value: &pb.Dim_Param{Param: name}} }
