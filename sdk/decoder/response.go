package decoder

import (
	"github.com/strata-llm/strata/sdk/dtype"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// ComputeDType is the compute dtype export options ask for (float32 when unset).
func ComputeDType(opts *pb.ExportOptions) (fn.DType, error) {
	return dtype.ParseCompute(opts.GetComputeDtype())
}

// Response packages a finished part function, the functions it calls and
// its weight bindings.
func Response(f *fn.Func, weights ...*pb.LayerWeights) *pb.BuildResponse {
	return &pb.BuildResponse{Function: f.Proto(), Dependencies: f.Dependencies(), Weights: weights}
}

// DimSize is a fixed dimension of a cache shape.
func DimSize(n int) *pb.Dim { return &pb.Dim{Value: &pb.Dim_Size{Size: int64(n)}} }

// DimParam is a symbolic dimension of a cache shape (batch_size, ctx_len).
func DimParam(name string) *pb.Dim { return &pb.Dim{Value: &pb.Dim_Param{Param: name}} }
