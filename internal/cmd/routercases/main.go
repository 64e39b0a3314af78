// Command routercases writes one ONNX model per MoE router case that
// generate.py recorded from transformers (conformance/fixtures/routers): the
// SDK's blocks.Router alone, its inputs (tokens x [T, H], router weight, bias,
// correction bias) as graph inputs, the chosen experts' weights and indices
// as outputs. The conformance suite runs them under ONNX Runtime against the
// recorded choices.
//
//	routercases --fixture conformance/fixtures/routers --out DIR
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

func main() {
	fixture := flag.String("fixture", "", "directory with cases.json (written by conformance/generate.py routers)")
	out := flag.String("out", "", "directory to write <case>.onnx into")
	flag.Parse()
	if *fixture == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "routercases: --fixture and --out are required")
		os.Exit(2)
	}
	if err := writeCases(*fixture, *out); err != nil {
		fmt.Fprintln(os.Stderr, "routercases:", err)
		os.Exit(1)
	}
}

// routerCase is one entry of cases.json.
type routerCase struct {
	Name       string   `json:"name"`
	Kind       string   `json:"kind"`
	Experts    int      `json:"experts"`
	TopK       int      `json:"top_k"`
	Normalize  bool     `json:"normalize"`
	Groups     int      `json:"groups"`
	TopKGroups int      `json:"topk_groups"`
	Scale      float64  `json:"scale"`
	Inputs     []string `json:"inputs"`
}

func writeCases(fixture, out string) error {
	data, err := os.ReadFile(filepath.Join(fixture, "cases.json"))
	if err != nil {
		return err
	}
	var cases []routerCase
	if err := json.Unmarshal(data, &cases); err != nil {
		return fmt.Errorf("cases.json: %w", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, c := range cases {
		model, err := c.model()
		if err != nil {
			return fmt.Errorf("case %s: %w", c.Name, err)
		}
		if err := os.WriteFile(filepath.Join(out, c.Name+".onnx"), model, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// model is the router as a function called from a graph whose inputs are the
// case's tensors.
func (c routerCase) model() ([]byte, error) {
	f := fn.NewFunc("strata.test", "Router", fn.Float32)
	x := f.Input("x")
	r := blocks.Router{Kind: c.Kind, Experts: c.Experts, TopK: c.TopK, Normalize: c.Normalize, Weight: f.Input("weight"),
		Groups: c.Groups, TopKGroups: c.TopKGroups, Scale: c.Scale}
	if slices.Contains(c.Inputs, "bias") {
		r.Bias = f.Input("bias")
	}
	if slices.Contains(c.Inputs, "correction_bias") {
		r.CorrectionBias = f.Input("correction_bias")
	}
	weights, indices, err := r.Route(f, x)
	if err != nil {
		return nil, err
	}
	f.Output("weights", weights)
	f.Output("indices", indices)
	body := f.Proto()

	b := graph.New("router")
	if err := b.Import("", fn.Opset); err != nil {
		return nil, err
	}
	call := graph.Call{Fn: body, Inputs: map[string]string{}, Prefix: "router",
		Outputs: map[string]string{"weights": "weights", "indices": "indices"}}
	dims := map[string][]graph.Dim{"x": {{Param: "tokens"}, {Param: "hidden"}}, "weight": {{Size: int64(c.Experts)}, {Param: "hidden"}},
		"bias": {{Size: int64(c.Experts)}}, "correction_bias": {{Size: int64(c.Experts)}}}
	for _, in := range body.GetInput() {
		b.Input(in, onnxpb.TensorProto_FLOAT, dims[in]...)
		call.Inputs[in] = in
	}
	if err := b.Inline(call); err != nil {
		return nil, err
	}
	k := graph.Dim{Size: int64(c.TopK)}
	b.Output("weights", onnxpb.TensorProto_FLOAT, graph.Dim{Param: "tokens"}, k)
	b.Output("indices", onnxpb.TensorProto_INT64, graph.Dim{Param: "tokens"}, k)
	return proto.MarshalOptions{Deterministic: true}.Marshal(b.Model(graph.Metadata{ProducerName: "routercases"}))
}
