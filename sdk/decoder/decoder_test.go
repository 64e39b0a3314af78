package decoder_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/hf"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"google.golang.org/protobuf/proto"
)

const base = `{"model_type": "toy", "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 3,
	"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32}`

// toy has two kinds (full and sliding attention, alternating), a context
// value of its own, an option, hidden states out, and a separate model.
var toy = decoder.Plugin{Name: "toy", Version: "1.0", Architectures: []decoder.Architecture{{
	ModelType: "toy", Name: "Toy",
	Options: []*pb.PluginOption{{Name: "flavour", DefaultValue: "plain", AllowedValues: []string{"plain", "fancy"}}},
	Load: func(m *decoder.Model) error {
		m.KindOf = func(i int) string { return []string{"full", "sliding"}[i%2] }
		m.OutputHidden = m.Options["flavour"] == "fancy"
		m.AddContext(decoder.SlidingWindow("sliding_mask", 2))
		m.Kind("full", "ToyFull", func(l *decoder.Layer) error {
			return l.PreNorm(&decoder.Attention{}, &decoder.SwiGLU{Width: m.Intermediate})
		})
		m.Kind("sliding", "ToySliding", func(l *decoder.Layer) error {
			return l.PreNorm(&decoder.Attention{Mask: "sliding_mask", Sinks: true}, &decoder.SwiGLU{Width: m.Intermediate})
		})
		m.AddModel(&pb.ModelSpec{Name: "embed"}, func(f *fn.Func) (*pb.BuildResponse, error) {
			f.Output("out", blocks.Embedding(f, f.Input("table"), f.Input(sdk.InputIDs)))
			return decoder.Response(f), nil
		})
		return nil
	},
}}}

func TestParseCommon(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string // error, or "" for none
	}{
		"defaults":          {func(m map[string]any) { delete(m, "num_key_value_heads") }, ""},
		"missing vocab":     {func(m map[string]any) { delete(m, "vocab_size") }, `"vocab_size" is missing`},
		"zero heads":        {func(m map[string]any) { m["num_attention_heads"] = 0 }, "num_attention_heads must be positive"},
		"kv not a divisor":  {func(m map[string]any) { m["num_key_value_heads"] = 3 }, "multiple of num_key_value_heads (3)"},
		"negative eps":      {func(m map[string]any) { m["rms_norm_eps"] = -1e-6 }, "rms_norm_eps must be a finite number"},
		"negative head_dim": {func(m map[string]any) { m["head_dim"] = -8 }, "head_dim must be positive"},
		"negative theta":    {func(m map[string]any) { m["rope_theta"] = -1 }, "rope_theta"},
		"bool as int":       {func(m map[string]any) { m["tie_word_embeddings"] = 1 }, `"tie_word_embeddings" must be true or false`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := hf.Parse(plugintest.Config(t, base, tc.edit))
			if err != nil {
				t.Fatal(err)
			}
			r := &hf.Reader{Config: c}
			common := decoder.ParseCommon(r)
			if tc.want == "" {
				if r.Err != nil || common.KVHeads != 4 || common.HeadDim != 4 {
					t.Errorf("err %v, kv heads %d, head_dim %d; want nil, 4, 4", r.Err, common.KVHeads, common.HeadDim)
				}
				return
			}
			if r.Err == nil || !strings.Contains(r.Err.Error(), tc.want) {
				t.Errorf("error %v, want %q", r.Err, tc.want)
			}
		})
	}
}

func TestPlanKindsContextAndOptions(t *testing.T) {
	model := plugintest.Edited(t, toy, base, nil, "F32")
	plan, err := toy.Plan(context.Background(), &pb.PlanRequest{Model: model,
		Options: &pb.ExportOptions{PluginOptions: map[string]string{"flavour": "fancy"}}})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, l := range plan.GetLayers() {
		kinds = append(kinds, l.GetKind())
	}
	if !slices.Equal(kinds, []string{"full", "sliding", "full"}) || len(plan.GetKinds()) != 2 {
		t.Errorf("kinds %v (%d declared)", kinds, len(plan.GetKinds()))
	}
	if !slices.Contains(plan.GetContextOutputs(), "sliding_mask") || !slices.Contains(plan.GetContextOutputs(), decoder.CtxMask) {
		t.Errorf("context outputs %v", plan.GetContextOutputs())
	}
	if x := plan.GetExtraOutputs(); len(x) != 1 || x[0].GetName() != sdk.HiddenStates {
		t.Errorf("extra outputs %v, want hidden_states", x)
	}
	if len(plan.GetModels()) != 1 || plan.GetModels()[0].GetName() != "embed" {
		t.Errorf("models %v", plan.GetModels())
	}
	for opts, want := range map[string]string{"flavour=odd": `flavour "odd": use plain or fancy`, "colour=red": `no option "colour" (it has: flavour)`} {
		k, v, _ := strings.Cut(opts, "=")
		_, err := toy.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: &pb.ExportOptions{PluginOptions: map[string]string{k: v}}})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", opts, err, want)
		}
	}
}

// Each kind's function declares its weights once: they are its inputs, the
// bindings of every layer of the kind, and what Check expects.
func TestDeclaredWeightsBindAndCheck(t *testing.T) {
	model := plugintest.Edited(t, toy, base, nil, "F32")
	parts := plugintest.RequireBound(t, toy, model,
		&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: "full", Layers: []int32{0, 2}},
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: "sliding", Layers: []int32{1}},
		&pb.BuildRequest{Part: sdk.PartFinal})
	if got := parts[3][1]["self_attn.sinks"]; !slices.Equal(got, []string{"model.layers.1.self_attn.sinks"}) {
		t.Errorf("sliding layer sinks bound to %v", got)
	}
	if _, ok := parts[2][0]["self_attn.sinks"]; ok {
		t.Error("a full layer binds sinks it does not declare")
	}
	resp, _ := toy.Check(context.Background(), &pb.CheckRequest{Model: model})
	if !resp.GetSupported() {
		t.Fatalf("unsupported: %v", resp.GetReasons())
	}
	// Every layer lacking its sinks: the check names a few and stops.
	var lacking []*pb.TensorInfo
	for _, ti := range model.GetTensors() {
		if !strings.HasSuffix(ti.Key, "self_attn.sinks") {
			lacking = append(lacking, ti)
		}
	}
	resp, _ = toy.Check(context.Background(), &pb.CheckRequest{Model: &pb.Model{ConfigJson: model.GetConfigJson(), Tensors: lacking}})
	if reasons := strings.Join(resp.GetReasons(), ";"); resp.GetSupported() || !strings.Contains(reasons, "model.layers.1.self_attn.sinks is missing") {
		t.Errorf("reasons %q", reasons)
	}
}

func TestBuildRefusals(t *testing.T) {
	model := plugintest.Edited(t, toy, base, nil, "F32")
	cases := map[string]struct {
		req  *pb.BuildRequest
		want string
	}{
		"unknown kind":     {&pb.BuildRequest{Part: sdk.PartLayer, Kind: "moe", Layers: []int32{0}}, `has layer kinds full, sliding; asked for "moe"`},
		"wrong kind":       {&pb.BuildRequest{Part: sdk.PartLayer, Kind: "sliding", Layers: []int32{0}}, "layer 0 is not of kind sliding"},
		"layer past count": {&pb.BuildRequest{Part: sdk.PartLayer, Kind: "full", Layers: []int32{4}}, "layer 4 is not of kind full"},
		"unknown part":     {&pb.BuildRequest{Part: "vision"}, `no part "vision"`},
		"unknown model":    {&pb.BuildRequest{Part: sdk.PartModel, ModelName: "mtp"}, `builds no model "mtp"`},
		"bad dtype":        {&pb.BuildRequest{Part: sdk.PartFinal, Options: &pb.ExportOptions{ComputeDtype: "int8"}}, "int8"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.req.Model = model
			_, err := toy.Build(context.Background(), tc.req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	resp, err := toy.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartModel, ModelName: "embed"})
	if err != nil || resp.GetFunction().GetName() != "ToyEmbed" {
		t.Errorf("separate model: %v, %v", resp.GetFunction().GetName(), err)
	}
}

// A num_hidden_layers the tensors cannot back is refused from the keys,
// in no time, naming what is missing.
func TestLayerCountBoundedByInventory(t *testing.T) {
	model := plugintest.Edited(t, toy, base, nil, "F32")
	model.ConfigJson = plugintest.Config(t, base, func(m map[string]any) { m["num_hidden_layers"] = 1_000_000_000 })
	resp, _ := toy.Check(context.Background(), &pb.CheckRequest{Model: model})
	if reasons := strings.Join(resp.GetReasons(), ";"); resp.GetSupported() || !strings.Contains(reasons, "holds tensors for 3 layers (0..2)") {
		t.Errorf("reasons %q", reasons)
	}
}

func TestDescribe(t *testing.T) {
	d, _ := toy.Describe(context.Background())
	a := d.GetArchitectures()[0]
	if d.GetProtocolVersion() != sdk.ProtocolVersion || !a.GetCapabilities().GetLayerwise() || a.GetOptions()[0].GetName() != "flavour" {
		t.Errorf("describe %v", d)
	}
}

// hooks uses what a multimodal model adds: a graph input of its own, an
// embed hook reading it, two context values reading input_ids (declared
// once), and a kind With a post step on layer 0 alone.
func hooks(rows int) decoder.Plugin {
	return decoder.Plugin{Name: "hooks", Version: "1.0", Architectures: []decoder.Architecture{{
		ModelType: "toy", Name: "Hooks",
		Load: func(m *decoder.Model) error {
			m.PositionRows = rows
			m.ExtraInputs = []*pb.IOSpec{{Name: sdk.InputIDs, Dtype: "int64"}, {Name: "extra", Dtype: "compute"}}
			m.Embed = func(f *fn.Func, ids, embedded fn.Value) fn.Value { return f.Add(embedded, f.Input("extra")) }
			for _, name := range []string{"a", "b"} {
				m.AddContext(decoder.ContextValue{Name: name, Compute: func(c *decoder.Context) fn.Value {
					return c.Op("Identity", []fn.Value{c.Input(sdk.InputIDs)})
				}})
			}
			k := m.Kind("plain", "HooksLayer", func(l *decoder.Layer) error {
				return l.PreNorm(&decoder.Attention{}, &decoder.SwiGLU{Width: m.Intermediate})
			})
			post := m.With(k, "post", "HooksPostLayer", func(l *decoder.Layer, h fn.Value) fn.Value { return l.Add(h, l.Input("extra")) })
			m.KindOf = func(i int) string { return map[bool]string{true: post.Name, false: k.Name}[i == 0] }
			return nil
		},
	}}}
}

func TestHooks(t *testing.T) {
	p := hooks(0)
	m := plugintest.Model(t, p, []byte(base), "F32")
	plan, err := p.Plan(context.Background(), &pb.PlanRequest{Model: m})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.GetExtraInputs()) != 2 || plan.GetLayers()[0].GetKind() != "post" || plan.GetLayers()[1].GetKind() != "plain" {
		t.Fatalf("plan: extra inputs %v, layers %v", plan.GetExtraInputs(), plan.GetLayers())
	}
	inputs := func(part, kind string) []string {
		resp, err := p.Build(context.Background(), &pb.BuildRequest{Model: m, Part: part, Kind: kind,
			Layers: map[string][]int32{"post": {0}, "plain": {1, 2}}[kind]})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetFunction().GetInput()
	}
	count := func(in []string, name string) int {
		n := 0
		for _, x := range in {
			if x == name {
				n++
			}
		}
		return n
	}
	for _, tc := range []struct {
		part, kind, name string
		want             int
	}{
		{sdk.PartEmbed, "", "extra", 1},
		{sdk.PartContext, "", sdk.InputIDs, 1}, // two values read it, one formal input
		{sdk.PartLayer, "post", "extra", 1},
		{sdk.PartLayer, "plain", "extra", 0},
	} {
		if got := count(inputs(tc.part, tc.kind), tc.name); got != tc.want {
			t.Errorf("%s %s: %s declared %d times, want %d", tc.part, tc.kind, tc.name, got, tc.want)
		}
	}
	if _, err := hooks(4).Plan(context.Background(), &pb.PlanRequest{Model: m}); err == nil || !strings.Contains(err.Error(), "rows need rank 3") {
		t.Errorf("4 rows with rank 2: %v", err)
	}
}

// Calls naming the same *pb.Model and options share one load; other
// options, another model or another Plugin value load again.
func TestLoadedOncePerModelAndOptions(t *testing.T) {
	loads := 0
	counting := func() decoder.Plugin {
		p := hooks(0)
		inner := p.Architectures[0].Load
		p.Architectures[0].Load = func(m *decoder.Model) error { loads++; return inner(m) }
		return p
	}
	p := counting()
	m := plugintest.Model(t, p, []byte(base), "F32")
	loads = 0 // Model loaded it to list the tensors
	opts := func(dt string) *pb.ExportOptions { return &pb.ExportOptions{ComputeDtype: dt} }
	plan := func(p decoder.Plugin, m *pb.Model, o *pb.ExportOptions) {
		t.Helper()
		if _, err := p.Plan(context.Background(), &pb.PlanRequest{Model: m, Options: o}); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		name  string
		call  func()
		loads int
	}{
		{"first plan", func() { plan(p, m, opts("float32")) }, 1},
		{"same model, equal options", func() { plan(p, m, opts("float32")) }, 1},
		{"build with them", func() {
			if _, err := p.Build(context.Background(), &pb.BuildRequest{Model: m, Options: opts("float32"), Part: sdk.PartFinal}); err != nil {
				t.Fatal(err)
			}
		}, 1},
		{"other options", func() { plan(p, m, opts("float16")) }, 2},
		{"an equal model, another message", func() { plan(p, proto.Clone(m).(*pb.Model), opts("float32")) }, 3},
		{"another plugin value", func() { plan(counting(), m, opts("float32")) }, 4},
	} {
		step.call()
		if loads != step.loads {
			t.Fatalf("%s: %d loads, want %d", step.name, loads, step.loads)
		}
	}
}

// A half-precision table exported in float32 is gathered as stored and the
// rows cast; tied to the head, in float32 already or for float16 compute,
// the table is bound in the compute dtype and gathered as it is.
func TestEmbedGathersHalfPrecisionTablesAsStored(t *testing.T) {
	for _, tc := range []struct {
		name, stored, compute string
		tied                  bool
		wantDtype             string
	}{
		{"bf16 table, float32", "BF16", "float32", false, "bfloat16"},
		{"f16 table, float32", "F16", "float32", false, "float16"},
		{"bf16 table tied to the head", "BF16", "float32", true, ""},
		{"f32 table", "F32", "float32", false, ""},
		{"bf16 table, float16 compute", "BF16", "float16", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := plugintest.Edited(t, toy, base, func(c map[string]any) { c["tie_word_embeddings"] = tc.tied }, tc.stored)
			resp, err := toy.Build(context.Background(), &pb.BuildRequest{Model: m, Part: sdk.PartEmbed, Options: &pb.ExportOptions{ComputeDtype: tc.compute}})
			if err != nil {
				t.Fatal(err)
			}
			b := resp.GetWeights()[0].GetBindings()[0]
			if b.GetDtype() != tc.wantDtype {
				t.Errorf("the table is bound in %q, want %q", b.GetDtype(), tc.wantDtype)
			}
			var ops []string
			for _, n := range resp.GetFunction().GetNode() {
				ops = append(ops, n.GetOpType())
			}
			if casts := slices.Contains(ops, "Cast"); casts != (tc.wantDtype != "") {
				t.Errorf("embedding ops %v: a Cast of the rows is %v, want %v", ops, casts, tc.wantDtype != "")
			}
		})
	}
}

// residual is a one-kind plugin whose layer is l.Residual with the given
// norm placements and attention.
func residual(attn func() *decoder.Attention, attnNorms, mlpNorms decoder.Norms) decoder.Plugin {
	return decoder.Plugin{Name: "res", Version: "1", Architectures: []decoder.Architecture{{ModelType: "toy", Name: "Res",
		Load: func(m *decoder.Model) error {
			m.Kind("decoder", "ResLayer", func(l *decoder.Layer) error {
				return l.Residual(attn(), attnNorms, &decoder.SwiGLU{Width: m.Intermediate}, mlpNorms)
			})
			return nil
		}}}}
}

// Residual declares the norms it is given, named by the plugin, around
// each branch and in input order (pre, branch, post); PreNorm is its
// pre-only case; q/k norms over all heads span heads*head_dim.
func TestResidualDeclaresPlacedNorms(t *testing.T) {
	allHeads := func() *decoder.Attention { return &decoder.Attention{QKNorm: true, QKNormAllHeads: true} }
	cases := map[string]struct {
		attn, mlp decoder.Norms
		want      []string // the layer's inputs after the standard ones
	}{
		"post only (OLMo-2)": {decoder.Norms{Post: "post_attention_layernorm"}, decoder.Norms{Post: "post_feedforward_layernorm"},
			[]string{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
				"self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
				"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_feedforward_layernorm.weight"}},
		"both (Gemma-2)": {decoder.Norms{Pre: "input_layernorm", Post: "post_attention_layernorm"},
			decoder.Norms{Pre: "pre_feedforward_layernorm", Post: "post_feedforward_layernorm"},
			[]string{"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
				"self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
				"pre_feedforward_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_feedforward_layernorm.weight"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := residual(allHeads, tc.attn, tc.mlp)
			model := plugintest.Edited(t, p, base, nil, "F32")
			parts := plugintest.RequireBound(t, p, model, &pb.BuildRequest{Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0, 2}})
			if got := parts[0][2]["post_attention_layernorm.weight"]; !slices.Equal(got, []string{"model.layers.2.post_attention_layernorm.weight"}) {
				t.Errorf("layer 2 post_attention_layernorm bound to %v", got)
			}
			resp, err := p.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0}})
			if err != nil {
				t.Fatal(err)
			}
			inputs := resp.GetFunction().GetInput()
			if got := inputs[len(inputs)-len(tc.want):]; !slices.Equal(got, tc.want) {
				t.Errorf("inputs %v, want %v", got, tc.want)
			}
			shapes := map[string][]int64{}
			tensors, err := p.ExpectedTensors(model)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range tensors {
				shapes[e.Key] = e.Shape
			}
			// 4 heads and 2 KV heads of head_dim 4.
			if q, k := shapes["model.layers.0.self_attn.q_norm.weight"], shapes["model.layers.0.self_attn.k_norm.weight"]; !slices.Equal(q, []int64{16}) || !slices.Equal(k, []int64{8}) {
				t.Errorf("q/k norms over all heads of shapes %v, %v; want [16], [8]", q, k)
			}
		})
	}
	// The all-heads form is an option of the q/k norms, not a norm alone.
	p := residual(func() *decoder.Attention { return &decoder.Attention{QKNormAllHeads: true} },
		decoder.Norms{Pre: "input_layernorm"}, decoder.Norms{Pre: "post_attention_layernorm"})
	model := plugintest.Edited(t, toy, base, nil, "F32")
	resp, _ := p.Check(context.Background(), &pb.CheckRequest{Model: model})
	if reasons := strings.Join(resp.GetReasons(), ";"); resp.GetSupported() || !strings.Contains(reasons, "QKNormAllHeads without QKNorm") {
		t.Errorf("supported %v, reasons %q", resp.GetSupported(), reasons)
	}
}
