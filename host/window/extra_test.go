package window

import (
	"slices"
	"testing"

	"github.com/strata-llm/strata/sdk"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// An extra output named like the hidden-state input of a window after the
// first (an MTP draft's hidden_states) is renamed in that window only.
func TestExtraOutputNamedLikeTheWindowInput(t *testing.T) {
	plan := &pb.PlanResponse{VocabSize: 8, HiddenSize: 4,
		Layers: []*pb.Layer{{Index: 0, Kind: "k"}, {Index: 1, Kind: "k"}}, Kinds: []*pb.LayerKind{{Name: "k"}},
		ExtraOutputs: []*pb.IOSpec{{Name: sdk.HiddenStates, Dtype: "compute",
			Shape: []*pb.Dim{{Value: &pb.Dim_Param{Param: "batch_size"}}, {Value: &pb.Dim_Param{Param: "seq_len"}}, {Value: &pb.Dim_Size{Size: 4}}}}}}
	m := ModelIO{Plan: plan, Compute: onnxpb.TensorProto_FLOAT}
	for _, tc := range []struct {
		span Span
		want string
	}{{Whole(2), sdk.HiddenStates}, {Span{1, 1, 2}, sdk.HiddenStates + FinalSuffix}} {
		io, err := m.Of(tc.span)
		if err != nil {
			t.Fatal(err)
		}
		var outs []string
		for _, o := range io.Outputs {
			outs = append(outs, o.Name)
		}
		if !slices.Contains(outs, tc.want) || (tc.want != sdk.HiddenStates && slices.Contains(outs, sdk.HiddenStates)) {
			t.Errorf("window %s outputs %v, want %s", tc.span, outs, tc.want)
		}
	}
}
