package export

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/window"
	suggestpkg "github.com/strata-llm/strata/internal/suggest"
	"github.com/strata-llm/strata/sdk"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// testPlan has two layers of kind decoder (caches past_key, past_value), a
// kind no layer has, and three context values.
func testPlan() *pb.PlanResponse {
	caches := []*pb.CacheSpec{{Name: "past_key"}, {Name: "past_value"}}
	return &pb.PlanResponse{ModelType: "test", VocabSize: 8,
		Layers:         []*pb.Layer{{Index: 0, Kind: "decoder"}, {Index: 1, Kind: "decoder"}},
		Kinds:          []*pb.LayerKind{{Name: "decoder", Caches: caches}, {Name: "unused", Caches: caches}},
		ContextOutputs: []string{"cos", "mask", "sliding_mask"}}
}

func function(inputs, outputs []string, nodes ...*onnxpb.NodeProto) *onnxpb.FunctionProto {
	return &onnxpb.FunctionProto{Domain: "strata.test", Name: "F", Input: inputs, Output: outputs, Node: nodes,
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: "", Version: 17}}}
}

// bindings binds each formal input of ws to a checkpoint key per layer.
func bindings(layers []int32, ws ...string) []*pb.LayerWeights {
	var out []*pb.LayerWeights
	for _, l := range layers {
		lw := &pb.LayerWeights{Layer: l}
		for _, w := range ws {
			key := "model.norm.weight"
			if l != sdk.NonLayer {
				key = fmt.Sprintf("model.layers.%d.%s", l, w)
			}
			lw.Bindings = append(lw.Bindings, &pb.WeightBinding{Input: w, Key: key})
		}
		out = append(out, lw)
	}
	return out
}

// goodLayer is a correct layer part of kind decoder: it reads a weight, two
// context values and its caches, and returns the hidden state and both
// caches' retained states.
func goodLayer() *pb.BuildResponse {
	return &pb.BuildResponse{
		Function: function([]string{sdk.HiddenStates, sdk.PositionIDs, "past_key", "past_value", "mask", "sliding_mask", "q_proj.weight"},
			[]string{sdk.HiddenStatesOut, "past_key_RetainedState", "past_value_RetainedState"},
			node("MatMul", "q_proj/MatMul", sdk.HiddenStates, "q_proj.weight"),
			node("Add", "masked", "q_proj/MatMul", "mask"),
			node("Add", "windowed", "masked", "sliding_mask"),
			&onnxpb.NodeProto{OpType: "Add", Name: "residual", Input: []string{"windowed", sdk.HiddenStates}, Output: []string{sdk.HiddenStatesOut}},
			&onnxpb.NodeProto{OpType: "Identity", Name: "keep_key", Input: []string{"past_key"}, Output: []string{"past_key_RetainedState"}},
			&onnxpb.NodeProto{OpType: "Identity", Name: "keep_value", Input: []string{"past_value"}, Output: []string{"past_value_RetainedState"}}),
		Weights: bindings([]int32{0, 1}, "q_proj.weight"),
	}
}

// goodFinal is a correct final part: logits = hidden_states · lm_head.
func goodFinal() *pb.BuildResponse {
	return &pb.BuildResponse{
		Function: function([]string{sdk.HiddenStates, "lm_head.weight"}, []string{sdk.Logits},
			&onnxpb.NodeProto{OpType: "MatMul", Name: "head", Input: []string{sdk.HiddenStates, "lm_head.weight"}, Output: []string{sdk.Logits}}),
		Weights: bindings([]int32{sdk.NonLayer}, "lm_head.weight"),
	}
}

// goodContext is a correct context part: each context value from
// position_ids and the cache's shape.
func goodContext() *pb.BuildResponse {
	return &pb.BuildResponse{Function: function([]string{sdk.PositionIDs, "past_key"}, []string{"cos", "mask", "sliding_mask"},
		&onnxpb.NodeProto{OpType: "Cos", Name: "cos", Input: []string{sdk.PositionIDs}, Output: []string{"cos"}},
		&onnxpb.NodeProto{OpType: "Shape", Name: "slots", Input: []string{"past_key"}, Output: []string{"slots"}},
		&onnxpb.NodeProto{OpType: "Less", Name: "mask", Input: []string{sdk.PositionIDs, "slots"}, Output: []string{"mask"}},
		&onnxpb.NodeProto{OpType: "Identity", Name: "sliding", Input: []string{"mask"}, Output: []string{"sliding_mask"}})}
}

func TestValidPartsPass(t *testing.T) {
	c := contracts{plan: testPlan()}
	embed := &pb.BuildResponse{
		Function: function([]string{sdk.InputIDs, "embed_tokens.weight"}, []string{sdk.HiddenStates},
			&onnxpb.NodeProto{OpType: "Gather", Name: "embed", Input: []string{"embed_tokens.weight", sdk.InputIDs}, Output: []string{sdk.HiddenStates}}),
		Weights: bindings([]int32{sdk.NonLayer}, "embed_tokens.weight"),
	}
	// A kind no layer has binds no weights.
	unused := goodLayer()
	unused.Weights = nil
	separate := &pb.ModelSpec{Name: "draft", Inputs: []*pb.IOSpec{{Name: sdk.HiddenStates}}, Outputs: []*pb.IOSpec{{Name: sdk.Logits}}}
	for name, tc := range map[string]struct {
		pc   partContract
		resp *pb.BuildResponse
	}{
		"embed":             {c.embed(), embed},
		"context":           {c.context(), goodContext()},
		"layer":             {c.layer(c.plan.GetKinds()[0]), goodLayer()},
		"kind without one":  {c.layer(c.plan.GetKinds()[1]), unused},
		"final":             {c.final(), goodFinal()},
		"separate model":    {separateContract(separate), goodFinal()},
		"layerwise context": {contracts{plan: testPlan(), windowSize: 1}.context(), goodContext()},
	} {
		t.Run(name, func(t *testing.T) {
			if err := tc.pc.check("test", tc.resp); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestValidateRefusesMistakes makes one mistake per case in a correct part
// and wants the error to name the plugin, the part, the node or input, and
// the value.
func TestValidateRefusesMistakes(t *testing.T) {
	c := contracts{plan: testPlan()}
	layer := func(edit func(r *pb.BuildResponse)) func() (partContract, *pb.BuildResponse) {
		return func() (partContract, *pb.BuildResponse) {
			r := goodLayer()
			edit(r)
			return c.layer(c.plan.GetKinds()[0]), r
		}
	}
	nodeOf := func(r *pb.BuildResponse, name string) *onnxpb.NodeProto {
		i := slices.IndexFunc(r.Function.Node, func(n *onnxpb.NodeProto) bool { return n.GetName() == name })
		return r.Function.Node[i]
	}
	renameInput := func(r *pb.BuildResponse, from, to string) {
		r.Function.Input[slices.Index(r.Function.Input, from)] = to
		for _, n := range r.Function.Node {
			for i, in := range n.Input {
				if in == from {
					n.Input[i] = to
				}
			}
		}
	}
	cases := map[string]struct {
		part func() (partContract, *pb.BuildResponse)
		want []string
	}{
		"a weight's key read as a value": {layer(func(r *pb.BuildResponse) {
			nodeOf(r, "q_proj/MatMul").Input[1] = "model.layers.0.q_proj.weight"
		}), []string{`plugin test: part layer kind "decoder": node "q_proj/MatMul" (MatMul) reads "model.layers.0.q_proj.weight", which nothing in the function defines (inputs: hidden_states, position_ids, past_key, past_value, mask, sliding_mask, q_proj.weight; did you mean q_proj.weight?)`}},
		"a value read before it is defined": {layer(func(r *pb.BuildResponse) {
			r.Function.Node[1], r.Function.Node[2] = r.Function.Node[2], r.Function.Node[1]
		}), []string{`node "windowed" (Add) reads "masked", which nothing in the function defines`}},
		"a value defined twice": {layer(func(r *pb.BuildResponse) {
			nodeOf(r, "windowed").Output[0] = "masked"
		}), []string{`node "windowed" (Add) writes "masked", which node "masked" (Add) already defines`}},
		"a formal input written": {layer(func(r *pb.BuildResponse) {
			nodeOf(r, "windowed").Output[0] = "mask"
		}), []string{`node "windowed" (Add) writes "mask", which is a formal input`}},
		"a domain not imported": {layer(func(r *pb.BuildResponse) {
			nodeOf(r, "masked").Domain = "com.example"
		}), []string{`node "masked" (com.example.Add) is of domain "com.example", which the function does not import (it imports: ai.onnx)`}},
		"an unknown context value": {layer(func(r *pb.BuildResponse) { renameInput(r, "sliding_mask", "sliding_msk") }),
			[]string{`part layer kind "decoder": input "sliding_msk" is bound to nothing: no weight binding names it and the host does not pass it (it passes the inputs hidden_states, position_ids; the caches past_key, past_value; the context values cos, mask, sliding_mask); did you mean sliding_mask?`}},
		"several unknown inputs": {layer(func(r *pb.BuildResponse) {
			renameInput(r, "sliding_mask", "sliding_msk")
			renameInput(r, "mask", "attention_mask")
		}), []string{`inputs "attention_mask" (did you mean mask?), "sliding_msk" (did you mean sliding_mask?) are bound to nothing`}},
		"a serving input without its option": {layer(func(r *pb.BuildResponse) { r.Function.Input = append(r.Function.Input, sdk.BatchIndex) }),
			[]string{`input "batch_index" is bound to nothing: the host passes it only with --continuous-batching, and no weight binding names it`}},
		"a context value outside a layer": {func() (partContract, *pb.BuildResponse) {
			r := goodFinal()
			r.Function.Input = append(r.Function.Input, "mask")
			return c.final(), r
		}, []string{`plugin test: part final: input "mask" is bound to nothing: the host passes context values to layers only, and no weight binding names it`}},
		"a cache without its retained state": {layer(func(r *pb.BuildResponse) {
			r.Function.Output = r.Function.Output[:2]
		}), []string{`part layer kind "decoder": the kind declares cache "past_value", but the function has no output "past_value_RetainedState", its retained state (outputs: hidden_states_out, past_key_RetainedState)`}},
		"an output the host does not read": {layer(func(r *pb.BuildResponse) {
			r.Function.Output[2] = "past_value_Retained"
			nodeOf(r, "keep_value").Output[0] = "past_value_Retained"
		}), []string{`the kind declares cache "past_value", but the function has no output "past_value_RetainedState"`,
			`declares output "past_value_Retained", which the host does not read (it reads hidden_states_out, past_key_RetainedState, past_value_RetainedState); did you mean past_value_RetainedState?`}},
		"an output no node produces": {layer(func(r *pb.BuildResponse) {
			nodeOf(r, "residual").Output[0] = "out"
		}), []string{`declares output "hidden_states_out", which no node produces`}},
		"a weight bound for one layer only": {layer(func(r *pb.BuildResponse) { r.Weights[1].Bindings = nil }),
			[]string{`input "q_proj.weight" is bound to a weight for some layers but not for layer 1`}},
		"a layer without bindings": {layer(func(r *pb.BuildResponse) { r.Weights = r.Weights[:1] }),
			[]string{`no weight bindings for layer 1`}},
		"a binding to no formal input": {layer(func(r *pb.BuildResponse) { r.Weights[0].Bindings[0].Input = "q_proj.weights" }),
			[]string{`binds weight "model.layers.0.q_proj.weight" to input "q_proj.weights", which the function does not declare; did you mean q_proj.weight?`}},
		"a weight bound to a context value": {layer(func(r *pb.BuildResponse) {
			r.Weights[0].Bindings = append(r.Weights[0].Bindings, &pb.WeightBinding{Input: "mask", Key: "model.mask"})
		}), []string{`binds weight "model.mask" to input "mask", which the host passes (one of the context values)`}},
		"an input bound twice": {layer(func(r *pb.BuildResponse) {
			r.Weights[1].Bindings = append(r.Weights[1].Bindings, r.Weights[1].Bindings[0])
		}), []string{`binds input "q_proj.weight" twice for layer 1`}},
		"a dependency reading nothing": {layer(func(r *pb.BuildResponse) {
			r.Dependencies = []*onnxpb.FunctionProto{{Domain: "strata.test", Name: "Helper", Input: []string{"x"}, Output: []string{"y"},
				OpsetImport: []*onnxpb.OperatorSetIdProto{{Version: 17}}, Node: []*onnxpb.NodeProto{node("Mul", "y", "x", "z")}}}
		}), []string{`part layer kind "decoder": function strata.test.Helper it calls: node "y" (Mul) reads "z", which nothing in the function defines (inputs: x)`}},
		"a cache no kind has": {func() (partContract, *pb.BuildResponse) {
			plan := testPlan()
			for _, k := range plan.Kinds {
				k.Caches = k.Caches[1:] // no past_key
			}
			return contracts{plan: plan, windowSize: 1}.context(), goodContext()
		}, []string{`plugin test: part context: input "past_key" is bound to nothing: no weight binding names it and the host does not pass it (it passes the inputs position_ids; the caches past_value)`}},
		"a context value the context part lacks": {func() (partContract, *pb.BuildResponse) {
			r := goodContext()
			r.Function.Output = r.Function.Output[:2]
			return c.context(), r
		}, []string{`plugin test: part context: has no output "sliding_mask", which the host reads (outputs: cos, mask)`}},
		"a separate model's input": {func() (partContract, *pb.BuildResponse) {
			spec := &pb.ModelSpec{Name: "draft", Inputs: []*pb.IOSpec{{Name: "hidden"}}, Outputs: []*pb.IOSpec{{Name: sdk.Logits}}}
			return separateContract(spec), goodFinal()
		}, []string{`plugin test: part model "draft": input "hidden_states" is bound to nothing: no weight binding names it and the host does not pass it (it passes the inputs hidden); did you mean hidden?`}},
		"more mistakes than an error lists": {layer(func(r *pb.BuildResponse) {
			for i := range 12 {
				r.Function.Node = append(r.Function.Node, node("Neg", fmt.Sprint("neg", i), fmt.Sprint("nothing", i)))
			}
		}), []string{`reads "nothing7"`, "; and 4 more"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pc, resp := tc.part()
			err := pc.check("test", resp)
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error\n  %v\nlacks\n  %s", err, want)
				}
			}
		})
	}
}

// The contracts are the assembler's: serving and extra inputs where the
// options and plan have them.
func TestContractsFollowOptionsAndPlan(t *testing.T) {
	plan := testPlan()
	plan.ExtraInputs = []*pb.IOSpec{{Name: "vision_embeds"}}
	plan.ExtraOutputs = []*pb.IOSpec{{Name: "hidden_states_final", PartOutput: "hidden_final"}}
	c := contracts{plan: plan, serving: window.Serving{ContinuousBatching: true, CCL: true}}
	final := goodFinal()
	final.Function.Input = append(final.Function.Input, sdk.BatchIndex, sdk.CompCtxLengths, "vision_embeds")
	final.Function.Output = append(final.Function.Output, "hidden_final")
	final.Function.Node = append(final.Function.Node,
		&onnxpb.NodeProto{OpType: "Identity", Name: "keep", Input: []string{sdk.HiddenStates}, Output: []string{"hidden_final"}})
	if err := c.final().check("test", final); err != nil {
		t.Error(err)
	}
	final.Function.Output = final.Function.Output[:1]
	if err := c.final().check("test", final); err == nil || !strings.Contains(err.Error(), `has no output "hidden_final", which the host reads`) {
		t.Errorf("error %v for a final part without the plan's extra output", err)
	}
}

func TestNearest(t *testing.T) {
	for _, tc := range []struct {
		name       string
		candidates []string
		want       []string
	}{
		{"model.layers.3.self_attn.q_proj.weight", []string{"self_attn.k_proj.weight", "self_attn.q_proj.weight", "cos"}, []string{"self_attn.q_proj.weight"}},
		{"sliding_msk", []string{"mask", "sliding_mask", "cos"}, []string{"sliding_mask"}},
		{"cos", []string{"sin", "mask"}, nil},
		{"q_proj", []string{"self_attn/q_proj", "k_proj", "v_proj"}, []string{"self_attn/q_proj", "k_proj", "v_proj"}},
	} {
		if got := suggestpkg.Nearest(tc.name, tc.candidates, 3); !slices.Equal(got, tc.want) {
			t.Errorf("nearest(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// BenchmarkValidateLayer checks one layer part of a thousand nodes, bound
// for 94 layers: what a header-only export of a 94-layer MoE pays per kind.
func BenchmarkValidateLayer(b *testing.B) {
	r := goodLayer()
	prev := sdk.HiddenStates
	for i := range 1000 {
		n := node("Relu", fmt.Sprint("relu", i), prev)
		r.Function.Node = append(r.Function.Node, n)
		prev = n.Output[0]
	}
	plan := testPlan()
	plan.Layers = nil
	var layers []int32
	for i := range int32(94) {
		plan.Layers = append(plan.Layers, &pb.Layer{Index: i, Kind: "decoder"})
		layers = append(layers, i)
	}
	r.Weights = bindings(layers, "q_proj.weight")
	pc := contracts{plan: plan}.layer(plan.GetKinds()[0])
	b.ResetTimer()
	for b.Loop() {
		if err := pc.check("bench", r); err != nil {
			b.Fatal(err)
		}
	}
}
