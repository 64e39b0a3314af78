package plugintest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// llama is the common decoder, as plugins/llama declares it.
var llama = decoder.Plugin{Name: "llama", Version: "0", Architectures: []decoder.Architecture{{
	ModelType: "llama", Name: "Llama", Load: func(m *decoder.Model) error {
		m.Kind("decoder", "LlamaDecoderLayer", func(l *decoder.Layer) error {
			return l.PreNorm(&decoder.Attention{}, &decoder.SwiGLU{Width: m.Intermediate})
		})
		return nil
	}}}}

const tinyConfig = `{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
	"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "rms_norm_eps": 1e-5}`

// tampered is arch with its plans and built parts edited: a plugin's mistakes.
type tampered struct {
	sdk.Architecture
	plan  func(*pb.PlanResponse)
	build func(*pb.BuildRequest, *pb.BuildResponse)
}

func (a tampered) Plan(ctx context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error) {
	resp, err := a.Architecture.Plan(ctx, req)
	if err == nil && a.plan != nil {
		a.plan(resp)
	}
	return resp, err
}

func (a tampered) Build(ctx context.Context, req *pb.BuildRequest) (*pb.BuildResponse, error) {
	resp, err := a.Architecture.Build(ctx, req)
	if err == nil && a.build != nil {
		a.build(req, resp)
	}
	return resp, err
}

// recorder takes what RequireBound reports instead of failing the test.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); panic(r) }

// reported runs RequireBound on every part of arch's model built with opts
// and returns what it reports.
func reported(t *testing.T, arch sdk.Architecture, opts *pb.ExportOptions) []string {
	r := &recorder{TB: t}
	defer func() {
		if x := recover(); x != nil && x != r {
			panic(x)
		}
	}()
	model := Model(t, llama, []byte(tinyConfig), "F32")
	RequireBound(r, arch, model, &pb.BuildRequest{Part: sdk.PartEmbed, Options: opts},
		&pb.BuildRequest{Part: sdk.PartContext, Options: opts},
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0, 1}, Options: opts},
		&pb.BuildRequest{Part: sdk.PartFinal, Options: opts})
	return r.errs
}

// dropInput removes a formal input of the layer part (and the nodes that
// read it are left reading nothing: only the inputs matter here).
func dropInput(name string) func(*pb.BuildRequest, *pb.BuildResponse) {
	return func(req *pb.BuildRequest, resp *pb.BuildResponse) {
		f := resp.GetFunction()
		f.Input = slices.DeleteFunc(f.Input, func(in string) bool { return in == name })
	}
}

// addConst puts a Constant node holding t into the parts of part.
func addConst(part string, t *onnxpb.TensorProto) func(*pb.BuildRequest, *pb.BuildResponse) {
	return func(req *pb.BuildRequest, resp *pb.BuildResponse) {
		if req.GetPart() == part {
			f := resp.GetFunction()
			f.Node = append(f.Node, &onnxpb.NodeProto{Name: "inlined", OpType: "Constant", Output: []string{"inlined_out"},
				Attribute: []*onnxpb.AttributeProto{fn.AttrTensor("value", t)}})
		}
	}
}

func floats(dims ...int64) *onnxpb.TensorProto {
	t, err := fn.FloatTensor(fn.Float32, dims, make([]float32, elements(dims))...)
	if err != nil {
		panic(err)
	}
	return t
}

// The serving inputs and weight-freedom: a decoder plugin passes with
// every option; each mistake is reported, naming it.
func TestRequireBoundReports(t *testing.T) {
	cb := &pb.ExportOptions{ContinuousBatching: true}
	ccl := &pb.ExportOptions{Ccl: true}
	both := &pb.ExportOptions{ContinuousBatching: true, Ccl: true}
	for _, opts := range []*pb.ExportOptions{nil, cb, ccl, both} {
		if errs := reported(t, llama, opts); len(errs) > 0 {
			t.Errorf("the common decoder with %v: %v", opts, errs)
		}
	}
	subgraph := func(req *pb.BuildRequest, resp *pb.BuildResponse) {
		if req.GetPart() == sdk.PartFinal {
			f := resp.GetFunction()
			g := &onnxpb.GraphProto{Name: "then", Initializer: []*onnxpb.TensorProto{{Name: "w", Dims: []int64{2}, DataType: int32(fn.Float32)}}}
			f.Node = append(f.Node, &onnxpb.NodeProto{Name: "branch", OpType: "If", Input: []string{"c"}, Output: []string{"y"},
				Attribute: []*onnxpb.AttributeProto{{Name: "then_branch", Type: onnxpb.AttributeProto_GRAPH, G: g}}})
		}
	}
	external := floats(4)
	external.DataLocation = onnxpb.TensorProto_EXTERNAL
	cases := map[string]struct {
		arch tampered
		opts *pb.ExportOptions
		want string
	}{
		"batch_index unread": {tampered{Architecture: llama, build: dropInput(sdk.BatchIndex)}, cb,
			"layer kind decoder has caches but does not read batch_index"},
		"batch_index unasked": {tampered{Architecture: llama, build: func(req *pb.BuildRequest, resp *pb.BuildResponse) {
			resp.Function.Input = append(resp.Function.Input, sdk.BatchIndex)
		}}, nil, "embed  reads batch_index, which the host passes only with continuous_batching"},
		"cache rows": {tampered{Architecture: llama, plan: func(p *pb.PlanResponse) {
			p.Kinds[0].Caches[0].Shape[0] = decoder.DimParam("batch_size")
		}}, cb, "cache past_key has shape"},
		"comp_ctx_lengths unread": {tampered{Architecture: llama, build: dropInput(sdk.CompCtxLengths)}, ccl,
			"with ccl, no part built reads comp_ctx_lengths"},
		"comp_ctx_lengths unasked": {tampered{Architecture: llama, build: func(req *pb.BuildRequest, resp *pb.BuildResponse) {
			if req.GetPart() == sdk.PartContext {
				resp.Function.Input = append(resp.Function.Input, sdk.CompCtxLengths)
			}
		}}, cb, "context  reads comp_ctx_lengths, which the host passes only with ccl"},
		"weight inlined": {tampered{Architecture: llama, build: addConst(sdk.PartLayer, floats(96, 64))}, nil,
			`node "inlined" (Constant) attribute value: a constant of shape [96 64], the shape of checkpoint tensor model.layers.0.mlp.gate_proj.weight`},
		"large constant": {tampered{Architecture: llama, build: addConst(sdk.PartFinal, floats(MaxInlineElements+1))}, nil,
			"a constant of 65537 elements [65537] (more than 65536)"},
		"external data":        {tampered{Architecture: llama, build: addConst(sdk.PartEmbed, external)}, nil, "a constant with external data"},
		"subgraph initializer": {tampered{Architecture: llama, build: subgraph}, nil, `attribute then_branch: subgraph initializer "w"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			errs := reported(t, tc.arch, tc.opts)
			if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tc.want) }) {
				t.Errorf("reported %q, want %q", errs, tc.want)
			}
		})
	}
}

// A small constant, or one shaped like no checkpoint tensor, is no weight.
func TestWeightFreeAllowsSmallConstants(t *testing.T) {
	model := Model(t, llama, []byte(tinyConfig), "F32")
	resp := &pb.BuildResponse{Function: &onnxpb.FunctionProto{}}
	addConst(sdk.PartFinal, floats(16))(&pb.BuildRequest{Part: sdk.PartFinal}, resp)
	addConst(sdk.PartFinal, floats(3, 5))(&pb.BuildRequest{Part: sdk.PartFinal}, resp)
	if p := WeightFree(resp, sdk.NewInventory(model)); len(p) > 0 {
		t.Errorf("small constants reported: %v", p)
	}
}

func TestKinds(t *testing.T) {
	plan, kinds := Kinds(t, llama, Model(t, llama, []byte(tinyConfig), "F32"), nil)
	if !slices.Equal(kinds, []string{"decoder", "decoder"}) || len(plan.GetKinds()) != 1 {
		t.Errorf("kinds %v, plan kinds %v", kinds, plan.GetKinds())
	}
}

func TestRekeyed(t *testing.T) {
	m := &pb.Model{Tensors: []*pb.TensorInfo{{Key: "a.x"}, {Key: "b.y"}, {Key: "c.z"}}}
	got := Rekeyed(m, "a.", "A.", "b.", "B.b.")
	var keys []string
	for _, t := range got.GetTensors() {
		keys = append(keys, t.GetKey())
	}
	if !slices.Equal(keys, []string{"A.x", "B.b.y", "c.z"}) || m.Tensors[0].Key != "a.x" {
		t.Errorf("keys %v (original %s)", keys, m.Tensors[0].Key)
	}
}
