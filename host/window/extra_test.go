package window

import (
	"slices"
	"strings"
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

// The plan's extra inputs follow position_ids in every window, once: the
// first window's own input_ids is not declared twice, later windows gain
// it. position_ids has the rows the plan asks for.
func TestExtraInputsAndPositionRows(t *testing.T) {
	param := func(p string) *pb.Dim { return &pb.Dim{Value: &pb.Dim_Param{Param: p}} }
	ids := &pb.IOSpec{Name: sdk.InputIDs, Dtype: "int64", Shape: []*pb.Dim{param("batch_size"), param("seq_len")}}
	embeds := &pb.IOSpec{Name: "vision_embeds", Dtype: "compute", Shape: []*pb.Dim{param("num_vision_tokens"), {Value: &pb.Dim_Size{Size: 4}}}}
	plan := func(rank, rows int32, extra ...*pb.IOSpec) *pb.PlanResponse {
		return &pb.PlanResponse{VocabSize: 8, HiddenSize: 4, PositionIdsRank: rank, PositionRows: rows, ExtraInputs: extra,
			Layers: []*pb.Layer{{Index: 0, Kind: "k"}, {Index: 1, Kind: "k"}}, Kinds: []*pb.LayerKind{{Name: "k"}}}
	}
	cases := map[string]struct {
		plan    *pb.PlanResponse
		span    Span
		inputs  []string
		posDims int64 // rows of position_ids, 0 for rank 2
		err     string
	}{
		"rank 2":                   {plan(2, 0), Whole(2), []string{sdk.InputIDs, sdk.PositionIDs}, 0, ""},
		"rank 3, default rows":     {plan(3, 0), Whole(2), []string{sdk.InputIDs, sdk.PositionIDs}, 3, ""},
		"rank 3, four rows":        {plan(3, 4, ids, embeds), Whole(2), []string{sdk.InputIDs, sdk.PositionIDs, "vision_embeds"}, 4, ""},
		"later window gains ids":   {plan(3, 4, ids, embeds), Span{1, 1, 2}, []string{BoundaryIn, sdk.PositionIDs, sdk.InputIDs, "vision_embeds"}, 4, ""},
		"five rows":                {plan(3, 5), Whole(2), nil, 0, "5 rows"},
		"an input unlike the own":  {plan(2, 0, &pb.IOSpec{Name: sdk.InputIDs, Dtype: "int32"}), Whole(2), nil, 0, "unlike"},
		"an extra input no name":   {plan(2, 0, &pb.IOSpec{Dtype: "int64"}), Whole(2), nil, 0, "without a name"},
		"an extra input bad dtype": {plan(2, 0, &pb.IOSpec{Name: "x", Dtype: "complex7"}), Whole(2), nil, 0, "x"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			io, err := ModelIO{Plan: tc.plan, Compute: onnxpb.TensorProto_FLOAT}.Of(tc.span)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, v := range io.Inputs[:len(tc.inputs)] {
				names = append(names, v.Name)
			}
			if !slices.Equal(names, tc.inputs) {
				t.Errorf("inputs %v, want %v first", names, tc.inputs)
			}
			pos := io.Inputs[slices.IndexFunc(io.Inputs, func(v Value) bool { return v.Name == sdk.PositionIDs })]
			if got := pos.Dims[0].Size; tc.posDims == 0 && len(pos.Dims) != 2 || tc.posDims != 0 && got != tc.posDims {
				t.Errorf("position_ids dims %v, want %d rows", pos.Dims, tc.posDims)
			}
		})
	}
}
