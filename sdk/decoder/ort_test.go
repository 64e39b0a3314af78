package decoder_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

var ortOpts = &pb.ExportOptions{ComputeDtype: "float32", Target: sdk.TargetORT}

// dense is one architecture whose layer kind is body.
func dense(body func(m *decoder.Model, l *decoder.Layer) error, load func(m *decoder.Model)) decoder.Plugin {
	return decoder.Plugin{Name: "dense", Version: "1.0", Architectures: []decoder.Architecture{{
		ModelType: "toy", Name: "Toy", Targets: []string{sdk.TargetORT},
		Load: func(m *decoder.Model) error {
			if load != nil {
				load(m)
			}
			m.Kind("decoder", "ToyLayer", func(l *decoder.Layer) error { return body(m, l) })
			return nil
		},
	}}}
}

func preNorm(attn decoder.Attention) func(m *decoder.Model, l *decoder.Layer) error {
	return func(m *decoder.Model, l *decoder.Layer) error {
		a := attn
		return l.PreNorm(&a, &decoder.SwiGLU{Width: m.Intermediate})
	}
}

func TestORTPlanAndParts(t *testing.T) {
	p := dense(preNorm(decoder.Attention{QKNorm: true}), nil)
	model := plugintest.Edited(t, p, base, nil, "F32")
	desc, err := p.Describe(context.Background())
	if err != nil || !slices.Contains(desc.GetArchitectures()[0].GetCapabilities().GetTargets(), sdk.TargetORT) {
		t.Fatalf("Describe does not declare the ort target: %v %v", desc, err)
	}
	plan, err := p.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: ortOpts})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(plan.GetContextOutputs(), decoder.ORTContext) {
		t.Errorf("context outputs %v, want %v", plan.GetContextOutputs(), decoder.ORTContext)
	}
	if x := plan.GetExtraInputs(); len(x) != 1 || x[0].GetName() != sdk.AttentionMask || x[0].GetDtype() != "int64" {
		t.Errorf("extra inputs %v, want attention_mask int64", x)
	}
	if d := plan.GetOrtDecoder(); d.GetNumAttentionHeads() != 4 || d.GetNumKeyValueHeads() != 2 || d.GetHeadSize() != 4 || d.GetHiddenSize() != 16 || d.GetContextLength() <= 0 {
		t.Errorf("ort_decoder %v, want 4 heads, 2 KV heads, head size 4, hidden 16", d)
	}
	if dim := plan.GetKinds()[0].GetCaches()[0].GetShape()[2].GetParam(); dim != "past_sequence_length" {
		t.Errorf("cache length %q, want past_sequence_length", dim)
	}
	layer, err := p.Build(context.Background(), &pb.BuildRequest{Model: model, Options: ortOpts, Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0}})
	if err != nil {
		t.Fatal(err)
	}
	ops := opTypes(layer)
	for _, want := range []string{"GroupQueryAttention", "SimplifiedLayerNormalization"} {
		if !slices.Contains(ops, want) {
			t.Errorf("layer ops %v lack %s", ops, want)
		}
	}
	for _, not := range []string{"CtxScatter", "CtxGather", "Softmax", "CustomRMSNorm"} {
		if slices.Contains(ops, not) {
			t.Errorf("layer ops %v hold %s of the default form", ops, not)
		}
	}
	in := layer.GetFunction().GetInput()
	if slices.Contains(in, sdk.PositionIDs) || !slices.Contains(in, decoder.CtxSeqlensK) {
		t.Errorf("layer inputs %v: want seqlens_k, no position_ids", in)
	}
	if !imports(layer, "com.microsoft") {
		t.Errorf("the layer function does not import com.microsoft: %v", layer.GetFunction().GetOpsetImport())
	}
	ctx, err := p.Build(context.Background(), &pb.BuildRequest{Model: model, Options: ortOpts, Part: sdk.PartContext})
	if err != nil {
		t.Fatal(err)
	}
	if in := ctx.GetFunction().GetInput(); !slices.Equal(in, []string{sdk.AttentionMask}) {
		t.Errorf("context inputs %v, want attention_mask alone", in)
	}
	final, err := p.Build(context.Background(), &pb.BuildRequest{Model: model, Options: ortOpts, Part: sdk.PartFinal})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(final.GetFunction().GetInput(), sdk.PositionIDs) || slices.Contains(opTypes(final), "GatherElements") {
		t.Errorf("the final part picks a last token (inputs %v): genai reads logits at every position", final.GetFunction().GetInput())
	}
}

// TestORTRotaryPlace: GroupQueryAttention turns q and k itself only where
// ONNX Runtime's CPU kernel can (head size and rotary width multiples of 16).
func TestORTRotaryPlace(t *testing.T) {
	for _, tc := range []struct {
		headDim int
		inside  bool
	}{{16, true}, {24, false}} {
		p := dense(preNorm(decoder.Attention{}), nil)
		model := plugintest.Edited(t, p, base, func(c map[string]any) { c["head_dim"] = tc.headDim }, "F32")
		layer, err := p.Build(context.Background(), &pb.BuildRequest{Model: model, Options: ortOpts, Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0}})
		if err != nil {
			t.Fatal(err)
		}
		if n := slices.Index(opTypes(layer), "GroupQueryAttention"); n < 0 {
			t.Fatalf("head_dim %d: no GroupQueryAttention", tc.headDim)
		}
		for _, n := range layer.GetFunction().GetNode() {
			if n.GetOpType() != "GroupQueryAttention" {
				continue
			}
			rotary := attrInt(n.GetAttribute(), "do_rotary") == 1
			if rotary != tc.inside || (n.GetInput()[7] != "") != tc.inside {
				t.Errorf("head_dim %d: do_rotary %v with cos_cache %q, want rotary inside GQA %v", tc.headDim, rotary, n.GetInput()[7], tc.inside)
			}
		}
	}
}

func TestORTRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		p    decoder.Plugin
		want string
	}{
		"sinks": {dense(preNorm(decoder.Attention{Sinks: true}), nil), "attention sinks"},
		"gate":  {dense(preNorm(decoder.Attention{OutputGate: true}), nil), "output gate"},
		"one-plus norms": {dense(preNorm(decoder.Attention{}), func(m *decoder.Model) { m.NormOnePlus = true }),
			"weighing by 1 + w"},
		"own context value": {dense(preNorm(decoder.Attention{Mask: "m"}), func(m *decoder.Model) {
			m.AddContext(decoder.ContextValue{Name: "m", Compute: func(c *decoder.Context) fn.Value { return c.PositionIDs }})
		}), "a context value of its own (m)"},
		"block of its own": {dense(func(m *decoder.Model, l *decoder.Layer) error {
			return l.PreNorm(&decoder.Attention{}, opaqueBlock{})
		}, nil), "decoder_test.opaqueBlock block (no ORT form yet)"},
	} {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, tc.p, base, nil, "F32")
			_, err := tc.p.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: ortOpts})
			if err == nil || !strings.Contains(err.Error(), "--target ort") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Plan: %v; want a --target ort refusal naming %q", err, tc.want)
			}
			if _, err := tc.p.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: &pb.ExportOptions{ComputeDtype: "float32"}}); err != nil && name != "block of its own" && name != "gate" {
				t.Errorf("the default target is refused too: %v", err)
			}
		})
	}
}

// TestORTSlidingWindow: SlidingWindow's mask is GQA's local_window_size,
// not a context value the layer reads.
func TestORTSlidingWindow(t *testing.T) {
	p := dense(preNorm(decoder.Attention{Mask: decoder.SlidingMask}), func(m *decoder.Model) {
		if _, err := decoder.EverySliding(m, 3); err != nil {
			t.Fatal(err)
		}
	})
	model := plugintest.Edited(t, p, base, nil, "F32")
	layer, err := p.Build(context.Background(), &pb.BuildRequest{Model: model, Options: ortOpts, Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(opTypes(layer), "GroupQueryAttention") {
		t.Fatal("no GroupQueryAttention")
	}
	if slices.Contains(layer.GetFunction().GetInput(), decoder.SlidingMask) {
		t.Errorf("the layer reads %s", decoder.SlidingMask)
	}
	for _, n := range layer.GetFunction().GetNode() {
		if n.GetOpType() == "GroupQueryAttention" && attrInt(n.GetAttribute(), "local_window_size") != 3 {
			t.Errorf("local_window_size %d, want 3", attrInt(n.GetAttribute(), "local_window_size"))
		}
	}
}

type opaqueBlock struct{}

func (opaqueBlock) Declare(*decoder.Layer) {}
func (opaqueBlock) Apply(_ *decoder.Layer, _ *fn.Func, x fn.Value) (fn.Value, error) {
	return x, nil
}

func opTypes(r *pb.BuildResponse) []string {
	var ops []string
	for _, n := range r.GetFunction().GetNode() {
		ops = append(ops, n.GetOpType())
	}
	for _, d := range r.GetDependencies() {
		for _, n := range d.GetNode() {
			ops = append(ops, n.GetOpType())
		}
	}
	return ops
}

func imports(r *pb.BuildResponse, domain string) bool {
	for _, o := range r.GetFunction().GetOpsetImport() {
		if o.GetDomain() == domain {
			return true
		}
	}
	return false
}

func attrInt(attrs []*onnxpb.AttributeProto, name string) int64 {
	for _, a := range attrs {
		if a.GetName() == name {
			return a.GetI()
		}
	}
	return 0
}

// TestORTResidualNormFused: the residual add after attention and the MLP's
// pre-norm are one SkipSimplifiedLayerNormalization, whose sum (output 3)
// is the residual the MLP's output is added to; post-only norms (OLMo-2)
// leave nothing to fuse.
func TestORTResidualNormFused(t *testing.T) {
	build := func(p decoder.Plugin) *pb.BuildResponse {
		// head_dim 16: GQA turns q and k itself, no Adds of the RoPE's own
		model := plugintest.Edited(t, p, base, func(c map[string]any) { c["head_dim"] = 16 }, "F32")
		layer, err := p.Build(context.Background(), &pb.BuildRequest{Model: model, Options: ortOpts, Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0}})
		if err != nil {
			t.Fatal(err)
		}
		return layer
	}
	layer := build(dense(preNorm(decoder.Attention{}), nil))
	count := func(ops []string, op string) (n int) {
		for _, o := range ops {
			if o == op {
				n++
			}
		}
		return n
	}
	ops := opTypes(layer)
	if count(ops, "SkipSimplifiedLayerNormalization") != 1 || count(ops, "Add") != 1 || count(ops, "SimplifiedLayerNormalization") != 1 {
		t.Fatalf("layer ops %v: want one SkipSimplifiedLayerNormalization, one Add (the MLP's residual), one SimplifiedLayerNormalization (input_layernorm)", ops)
	}
	var skip, add *onnxpb.NodeProto
	for _, n := range layer.GetFunction().GetNode() {
		switch n.GetOpType() {
		case "SkipSimplifiedLayerNormalization":
			skip = n
		case "Add":
			add = n
		}
	}
	out := skip.GetOutput()
	if skip.GetDomain() != "com.microsoft" || len(out) != 4 || out[0] == "" || out[1] != "" || out[2] != "" || out[3] == "" {
		t.Errorf("SkipSimplifiedLayerNormalization %s outputs %q: want the normed sum and the sum, no mean or inv_std_var", skip.GetDomain(), out)
	}
	if in := skip.GetInput(); len(in) != 3 || in[0] != sdk.HiddenStates || in[2] != "post_attention_layernorm.weight" {
		t.Errorf("SkipSimplifiedLayerNormalization inputs %q: want the layer's hidden state, attention's output, post_attention_layernorm.weight", in)
	}
	if !slices.Contains(add.GetInput(), out[3]) {
		t.Errorf("the MLP's residual add %q does not add to the fused sum %s", add.GetInput(), out[3])
	}
	post := build(dense(func(m *decoder.Model, l *decoder.Layer) error {
		return l.Residual(&decoder.Attention{}, decoder.Norms{Post: "post_attention_layernorm"}, &decoder.SwiGLU{Width: m.Intermediate}, decoder.Norms{Post: "post_feedforward_layernorm"})
	}, nil))
	if ops := opTypes(post); count(ops, "SkipSimplifiedLayerNormalization") != 0 || count(ops, "Add") != 2 {
		t.Errorf("post-only norms: ops %v, want two Adds and no fused norm", ops)
	}
}
