package export

import (
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/quant"
	"github.com/strata-llm/strata/internal/headeronly"
	"github.com/strata-llm/strata/sdk/blocks"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// fp8DynamicView is a checkpoint whose layer 0 q_proj quantises its inputs
// per token (FP8_DYNAMIC) and whose layer 1 q_proj is not quantised.
func fp8DynamicView(t *testing.T) *quant.View {
	t.Helper()
	dir := t.TempDir()
	cfg := `{"model_type": "llama", "quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
		"ignore": ["model.layers.1.q_proj"], "config_groups": {"group_0": {"targets": ["Linear"],
		"weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true},
		"input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true, "symmetric": true}}}}}`
	ts := []headeronly.Tensor{
		{Name: "model.layers.0.q_proj.weight", DType: "F8_E4M3", Shape: []int64{8, 4}},
		{Name: "model.layers.0.q_proj.weight_scale", DType: "BF16", Shape: []int64{8, 1}},
		{Name: "model.layers.1.q_proj.weight", DType: "BF16", Shape: []int64{8, 4}},
		{Name: "model.layers.0.norm.weight", DType: "BF16", Shape: []int64{4}},
	}
	if _, err := headeronly.Write(dir, []byte(cfg), ts, 1<<30); err != nil {
		t.Fatal(err)
	}
	ckpt, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := quant.Read(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func node(op, name string, in ...string) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{OpType: op, Name: name, Input: in, Output: []string{name}}
}

// layer is a layer function y = x · transpose(w) (+ a norm weight used by
// Mul), bound for the given layers to q_proj and the norm.
func layer(layers []int32, extra ...*onnxpb.NodeProto) *pb.BuildResponse {
	nodes := append([]*onnxpb.NodeProto{node("Transpose", "wt", "w"), node("MatMul", "y", "x", "wt"), node("Mul", "z", "y", "n")}, extra...)
	resp := &pb.BuildResponse{Function: &onnxpb.FunctionProto{Name: "decoder", Input: []string{"x", "w", "n"}, Output: []string{"z"}, Node: nodes}}
	for _, l := range layers {
		resp.Weights = append(resp.Weights, &pb.LayerWeights{Layer: l, Bindings: []*pb.WeightBinding{
			{Input: "w", Key: "model.layers." + string(rune('0'+l)) + ".q_proj.weight"},
			{Input: "n", Key: "model.layers.0.norm.weight"},
		}})
	}
	return resp
}

func TestQuantizeActivationsWrapsTheMatMulOperand(t *testing.T) {
	resp := layer([]int32{0})
	if err := quantizeActivations(resp, fp8DynamicView(t)); err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, n := range resp.GetFunction().GetNode() {
		ops = append(ops, n.GetOpType()+"("+strings.Join(n.GetInput(), ",")+")")
	}
	want := "Transpose(w) FP8DynamicPerToken(x) MatMul(actquant/x,wt) Mul(y,n)"
	if got := strings.Join(ops, " "); got != want {
		t.Errorf("nodes %s, want %s", got, want)
	}
	if deps := resp.GetDependencies(); len(deps) != 1 || deps[0].GetDomain() != blocks.QuantDomain {
		t.Errorf("dependencies %v: the quantiser must ship with the model", deps)
	}
}

// A part that calls a local function with the weight (an MTP draft calling
// its layer, --subfunctions) has the MatMul inside that function rewritten.
func TestQuantizeActivationsFollowsCalls(t *testing.T) {
	inner := layer([]int32{0}).GetFunction()
	inner.Domain, inner.Name = "local", "layer"
	resp := &pb.BuildResponse{
		Function: &onnxpb.FunctionProto{Name: "mtp", Input: []string{"h", "w", "n"}, Output: []string{"z"},
			Node: []*onnxpb.NodeProto{{OpType: "layer", Domain: "local", Name: "call", Input: []string{"h", "w", "n"}, Output: []string{"z"}}}},
		Weights:      []*pb.LayerWeights{{Layer: 0, Bindings: []*pb.WeightBinding{{Input: "w", Key: "model.layers.0.q_proj.weight"}, {Input: "n", Key: "model.layers.0.norm.weight"}}}},
		Dependencies: []*onnxpb.FunctionProto{inner},
	}
	if err := quantizeActivations(resp, fp8DynamicView(t)); err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, n := range inner.GetNode() {
		ops = append(ops, n.GetOpType()+"("+strings.Join(n.GetInput(), ",")+")")
	}
	if got, want := strings.Join(ops, " "), "Transpose(w) FP8DynamicPerToken(x) MatMul(actquant/x,wt) Mul(y,n)"; got != want {
		t.Errorf("the called function's nodes %s, want %s", got, want)
	}
}

func TestQuantizeActivationsRefuses(t *testing.T) {
	v := fp8DynamicView(t)
	cases := map[string]struct {
		resp *pb.BuildResponse
		want string
	}{
		"layers of one kind differ": {layer([]int32{0, 1}), "input w binds weights whose layer inputs are quantised differently (layer 1)"},
		"weight used by another op": {layer([]int32{0}, node("Add", "bad", "wt", "x")), "reaches a Add node bad"},
		"weight on the left":        {layer([]int32{0}, node("MatMul", "left", "wt", "x")), "reaches a MatMul node left"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := quantizeActivations(tc.resp, v)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	unused := layer([]int32{0})
	unused.Function.Node = unused.Function.Node[2:] // w bound, never multiplied
	if err := quantizeActivations(unused, v); err == nil || !strings.Contains(err.Error(), "is not the B operand of a MatMul") {
		t.Errorf("error %v for a weight no MatMul reads", err)
	}
	plain := layer([]int32{1})
	if err := quantizeActivations(plain, v); err != nil || len(plain.GetDependencies()) != 0 {
		t.Errorf("an unquantised layer must stay as built: %v", err)
	}
}
