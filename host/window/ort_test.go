package window

import (
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/sdk/dtype"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func ortPlan(caches ...string) *pb.PlanResponse {
	kind := &pb.LayerKind{Name: "decoder"}
	for _, c := range caches {
		kind.Caches = append(kind.Caches, &pb.CacheSpec{Name: c, Shape: []*pb.Dim{
			{Value: &pb.Dim_Param{Param: "batch_size"}}, {Value: &pb.Dim_Size{Size: 2}},
			{Value: &pb.Dim_Param{Param: ORTPastLength}}, {Value: &pb.Dim_Size{Size: 8}}}})
	}
	return &pb.PlanResponse{VocabSize: 32, HiddenSize: 16, Kinds: []*pb.LayerKind{kind},
		Layers:      []*pb.Layer{{Index: 0, Kind: "decoder"}, {Index: 1, Kind: "decoder"}},
		ExtraInputs: []*pb.IOSpec{{Name: "attention_mask", Dtype: "int64", Shape: []*pb.Dim{{Value: &pb.Dim_Param{Param: "batch_size"}}, {Value: &pb.Dim_Param{Param: ORTTotalLength}}}}}}
}

func names(vs []Value) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Name)
	}
	return out
}

// TestORTIO: onnxruntime-genai's decoder IO, as its genai_config.json names it.
func TestORTIO(t *testing.T) {
	compute, _ := dtype.ParseCompute("float32")
	io, err := ModelIO{Plan: ortPlan("past_key", "past_value"), Compute: compute, ORT: true}.Of(Whole(2))
	if err != nil {
		t.Fatal(err)
	}
	wantIn := []string{"input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value", "past_key_values.1.key", "past_key_values.1.value"}
	wantOut := []string{"logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"}
	if !slices.Equal(names(io.Inputs), wantIn) || !slices.Equal(names(io.Outputs), wantOut) {
		t.Fatalf("IO %v -> %v, want %v -> %v", names(io.Inputs), names(io.Outputs), wantIn, wantOut)
	}
	if d := io.Outputs[0].Dims; d[1] != (graph.Dim{Param: "sequence_length"}) {
		t.Errorf("logits dims %v: want every position", d)
	}
	if in, out := io.Inputs[2].Dims[2], io.Outputs[1].Dims[2]; in.Param != ORTPastLength || out.Param != ORTTotalLength {
		t.Errorf("cache length %v in, %v out; want %s in, %s out", in, out, ORTPastLength, ORTTotalLength)
	}
	last := ortPlan("past_key", "past_value")
	last.OrtDecoder = &pb.OrtDecoder{LastTokenLogits: true}
	io, err = ModelIO{Plan: last, Compute: compute, ORT: true}.Of(Whole(2))
	if err != nil {
		t.Fatal(err)
	}
	if d := io.Outputs[0].Dims; d[1] != (graph.Dim{Size: 1}) {
		t.Errorf("logits dims %v with last_token_logits: want one row, a fixed 1 (genai's pruned form)", d)
	}
}

func TestORTRefusesOtherCaches(t *testing.T) {
	compute, _ := dtype.ParseCompute("float32")
	_, err := ModelIO{Plan: ortPlan("conv_state"), Compute: compute, ORT: true}.Of(Whole(2))
	if err == nil || !strings.Contains(err.Error(), `cache "conv_state"`) {
		t.Fatalf("got %v, want a refusal naming conv_state", err)
	}
}
