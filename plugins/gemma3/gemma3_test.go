package gemma3

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/refeval"
	"google.golang.org/protobuf/proto"
)

// tinyConfig is shaped like transformers 5's save of a Gemma3TextConfig:
// per-layer-type rope_parameters, layer_types written out.
const tinyConfig = `{"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_size": 64,
	"intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
	"head_dim": 16, "vocab_size": 128, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
	"attention_bias": false, "query_pre_attn_scalar": 256, "sliding_window": 4, "max_position_embeddings": 128,
	"tie_word_embeddings": true, "attn_logit_softcapping": null, "final_logit_softcapping": null,
	"use_bidirectional_attention": false,
	"layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
	"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
		"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}`

func TestRefusals(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"silu":                     {func(m map[string]any) { m["hidden_activation"] = "silu" }, `hidden_activation "silu" is not supported by the gemma3 plugin`},
		"attn softcapping 0":       {func(m map[string]any) { m["attn_logit_softcapping"] = 0.0 }, "attn_logit_softcapping must be a finite number > 0 (or null), got 0"},
		"final softcapping <0":     {func(m map[string]any) { m["final_logit_softcapping"] = -30.0 }, "final_logit_softcapping must be a finite number > 0 (or null), got -30"},
		"final softcapping string": {func(m map[string]any) { m["final_logit_softcapping"] = "30" }, "final_logit_softcapping"},
		"bidirectional":            {func(m map[string]any) { m["use_bidirectional_attention"] = true }, "use_bidirectional_attention is not supported"},
		"partial rotary":           {func(m map[string]any) { m["partial_rotary_factor"] = 0.5 }, "partial_rotary_factor is not supported by the gemma3 plugin"},
		"unknown layer type": {func(m map[string]any) {
			m["layer_types"] = []string{"sliding_attention", "chunked_attention", "full_attention"}
		}, `layer_types[1] is "chunked_attention"`},
		"layer_types length": {func(m map[string]any) { m["layer_types"] = []string{"full_attention"} }, "layer_types has 1 entries; num_hidden_layers is 3"},
		"null window":        {func(m map[string]any) { m["sliding_window"] = nil }, "sliding_window is null, but layer_types names sliding_attention layers"},
		"zero window":        {func(m map[string]any) { m["sliding_window"] = 0 }, "sliding_window must be positive, got 0"},
		"query scalar":       {func(m map[string]any) { m["query_pre_attn_scalar"] = 0 }, "query_pre_attn_scalar must be a finite number > 0"},
		"yarn": {func(m map[string]any) {
			m["rope_parameters"].(map[string]any)["full_attention"] = map[string]any{"rope_type": "yarn", "factor": 8.0}
		}, `rope_parameters.full_attention: rope type "yarn" is not supported by the gemma3 plugin (supported: default, linear)`},
		"flat rope_parameters": {func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": 10000.0}
		},
			"rope_parameters must hold full_attention and sliding_attention objects"},
		"bad local base": {func(m map[string]any) { delete(m, "rope_parameters"); m["rope_local_base_freq"] = -1.0 }, "rope_local_base_freq must be a finite number > 0"},
		"default kv heads": {func(m map[string]any) { delete(m, "num_key_value_heads"); m["num_attention_heads"] = 6 },
			"num_attention_heads (6) must be a multiple of num_key_value_heads (4) (config.json omits num_key_value_heads: model_type gemma3_text's default is 4"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tinyConfig, nil, "F32")
			model.ConfigJson = plugintest.Config(t, tinyConfig, tc.edit)
			if ok, reasons := plugintest.Check(t, plugin, model); ok || !strings.Contains(reasons, tc.want) {
				t.Errorf("supported=%v reasons=%q, want %q", ok, reasons, tc.want)
			}
		})
	}
}

// layer_types picks each layer's kind; absent, Gemma3TextConfig's default
// pattern (every sliding_window_pattern-th layer full, 6 when absent).
func TestLayerKinds(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want []string
	}{
		"layer_types": {nil, []string{kindSliding, kindFull, kindSliding}},
		"default pattern": {func(m map[string]any) { delete(m, "layer_types"); m["num_hidden_layers"] = 7 },
			[]string{kindSliding, kindSliding, kindSliding, kindSliding, kindSliding, kindFull, kindSliding}},
		"pattern 2": {func(m map[string]any) { delete(m, "layer_types"); m["sliding_window_pattern"] = 2 },
			[]string{kindSliding, kindFull, kindSliding}},
		"all full": {func(m map[string]any) {
			m["layer_types"] = []string{"full_attention", "full_attention", "full_attention"}
		},
			[]string{kindFull, kindFull, kindFull}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tinyConfig, tc.edit, "F32")
			plan, got := plugintest.Kinds(t, plugin, model, nil)
			if !slices.Equal(got, tc.want) {
				t.Errorf("kinds %v, want %v", got, tc.want)
			}
			sliding := slices.Contains(tc.want, kindSliding)
			if ctx := plan.GetContextOutputs(); slices.Contains(ctx, ctxSlidingMask) != sliding || slices.Contains(ctx, localRoPE+"_cos") != sliding {
				t.Errorf("context outputs %v (sliding layers: %v)", ctx, sliding)
			}
		})
	}
}

// Each layer binds four norms and the q/k norms [head_dim]; the sliding
// layers read the sliding mask and the local tables, the full ones the
// model's; the head is the embedding (tied by default).
func TestBuildBindsEveryWeight(t *testing.T) {
	model := plugintest.Edited(t, plugin, tinyConfig, func(m map[string]any) { delete(m, "tie_word_embeddings") }, "F32")
	parts := plugintest.RequireBound(t, plugin, model,
		&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindSliding, Layers: []int32{0, 2}},
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindFull, Layers: []int32{1}},
		&pb.BuildRequest{Part: sdk.PartFinal})
	for _, name := range []string{"input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
		"post_feedforward_layernorm.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight"} {
		if got := parts[2][2][name]; !slices.Equal(got, []string{"model.layers.2." + name}) {
			t.Errorf("layer 2 %s bound to %v", name, got)
		}
		if got := parts[3][1][name]; !slices.Equal(got, []string{"model.layers.1." + name}) {
			t.Errorf("layer 1 %s bound to %v", name, got)
		}
	}
	if got := parts[4][sdk.NonLayer]["lm_head.weight"]; !slices.Equal(got, []string{"model.embed_tokens.weight"}) {
		t.Errorf("head bound to %v, want the tied embedding", got)
	}
	inputs := func(kind string, layer int32) []string {
		resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartLayer, Kind: kind, Layers: []int32{layer}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetFunction().GetInput()
	}
	if in := inputs(kindSliding, 0); !slices.Contains(in, ctxSlidingMask) || !slices.Contains(in, localRoPE+"_cos") {
		t.Errorf("sliding layer inputs %v", in)
	}
	if in := inputs(kindFull, 1); slices.Contains(in, ctxSlidingMask) || slices.Contains(in, localRoPE+"_cos") {
		t.Errorf("full layer inputs %v", in)
	}
	want, err := plugin.ExpectedTensors(model)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range want {
		if e.Key == "model.layers.0.self_attn.q_norm.weight" && !slices.Equal(e.Shape, []int64{16}) {
			t.Errorf("q_norm shape %v, want [head_dim]", e.Shape)
		}
	}
}

// The Hub's config form (rope_theta, rope_scaling, rope_local_base_freq)
// gives the tables of transformers 5's per-layer-type rope_parameters; the
// full layers' (the model's cos) are linear-scaled, the sliding layers'
// turn at the local base.
func TestRoPEForms(t *testing.T) {
	legacy := func(m map[string]any) {
		delete(m, "rope_parameters")
		m["rope_theta"], m["rope_local_base_freq"] = 1000000.0, 10000.0
		m["rope_scaling"] = map[string]any{"rope_type": "linear", "factor": 8.0}
	}
	tables := func(edit func(map[string]any)) map[string]refeval.Tensor {
		model := plugintest.Edited(t, plugin, tinyConfig, edit, "F32")
		resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartContext})
		if err != nil {
			t.Fatal(err)
		}
		out, err := refeval.Run(resp.GetFunction(), resp.GetDependencies(), map[string]refeval.Tensor{
			sdk.PositionIDs: refeval.Ints([]int64{1, 1}, 5), decoder.PastKey: refeval.Floats([]int64{1, 2, 8, 16}, make([]float32, 256)...)})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	nested, old := tables(nil), tables(legacy)
	for name, base := range map[string]float64{decoder.CtxCos: 1e6, localRoPE + "_cos": 1e4} {
		scale := 1.0
		if name == decoder.CtxCos {
			scale = 8
		}
		for j, got := range nested[name].F {
			want := math.Cos(5 * math.Pow(base, -float64(2*(j%8))/16) / scale)
			if math.Abs(float64(got)-want) > 1e-5 {
				t.Errorf("%s[%d] = %g, want %g", name, j, got, want)
			}
		}
		if !slices.Equal(nested[name].F, old[name].F) {
			t.Errorf("%s: the legacy config form gives %v, rope_parameters %v", name, old[name].F, nested[name].F)
		}
	}
}

// The embedding is scaled by √hidden_size, and the head_dim and KV heads
// default to Gemma3TextConfig's (256, 4) when absent. (The attention's
// query_pre_attn_scalar^-½ shows in the fixtures: 20 and 32, not head_dim.)
func TestScalesAndDefaults(t *testing.T) {
	model := plugintest.Edited(t, plugin, tinyConfig, nil, "F32")
	resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartEmbed})
	if err != nil {
		t.Fatal(err)
	}
	out, err := refeval.Run(resp.GetFunction(), resp.GetDependencies(), map[string]refeval.Tensor{
		sdk.InputIDs: refeval.Ints([]int64{1, 1}, 1), "embed_tokens.weight": refeval.Floats([]int64{128, 64}, slices.Repeat([]float32{1}, 128*64)...)})
	if err != nil {
		t.Fatal(err)
	}
	if got := out[sdk.HiddenStates].F[0]; got != 8 {
		t.Errorf("embedding scaled by %g, want √64 = 8", got)
	}
	model = plugintest.Edited(t, plugin, tinyConfig, func(m map[string]any) {
		delete(m, "head_dim")
		delete(m, "num_key_value_heads")
	}, "F32")
	want, err := plugin.ExpectedTensors(model)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range want {
		if e.Key == "model.layers.0.self_attn.k_proj.weight" && !slices.Equal(e.Shape, []int64{4 * 256, 64}) {
			t.Errorf("k_proj shape %v, want [4 KV heads × head_dim 256, 64]", e.Shape)
		}
	}
}

// final_logit_softcapping caps the final part's logits at cap·tanh(raw/cap);
// attn_logit_softcapping leaves every graph as it is, as transformers'
// Gemma-3 attention ignores it (the conformance fixture gemma3-f32-softcap
// sets both).
func TestSoftCaps(t *testing.T) {
	const limit = 0.5
	build := func(edit func(map[string]any), req *pb.BuildRequest) *pb.BuildResponse {
		req.Model = plugintest.Edited(t, plugin, tinyConfig, edit, "F32")
		resp, err := plugin.Build(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	const H, V = 64, 128
	hidden, head := make([]float32, 2*H), make([]float32, V*H)
	for i := range hidden {
		hidden[i] = float32(i%9) - 4
	}
	for i := range head {
		head[i] = float32(i%7)/3 - 1
	}
	logits := func(edit func(map[string]any)) []float32 {
		resp := build(edit, &pb.BuildRequest{Part: sdk.PartFinal})
		out, err := refeval.Run(resp.GetFunction(), resp.GetDependencies(), map[string]refeval.Tensor{
			sdk.HiddenStates: refeval.Floats([]int64{1, 2, H}, hidden...), sdk.PositionIDs: refeval.Ints([]int64{1, 2}, 0, 1),
			"norm.weight": refeval.Floats([]int64{H}, make([]float32, H)...), "lm_head.weight": refeval.Floats([]int64{V, H}, head...)})
		if err != nil {
			t.Fatal(err)
		}
		return out[sdk.Logits].F
	}
	raw := logits(nil)
	capped := logits(func(m map[string]any) { m["final_logit_softcapping"] = limit })
	bites := false
	for i, r := range raw {
		want := limit * math.Tanh(float64(r)/limit)
		bites = bites || math.Abs(float64(r)) > limit
		if math.Abs(float64(capped[i])-want) > 1e-6 {
			t.Errorf("logits[%d] = %g, want %g (raw %g)", i, capped[i], want, r)
		}
	}
	if !bites {
		t.Fatal("no raw logit exceeds the cap: the test does not test it")
	}
	attn := func(m map[string]any) { m["attn_logit_softcapping"] = limit }
	for _, kind := range []string{kindSliding, kindFull} {
		layer := int32(0)
		if kind == kindFull {
			layer = 1
		}
		req := func() *pb.BuildRequest {
			return &pb.BuildRequest{Part: sdk.PartLayer, Kind: kind, Layers: []int32{layer}}
		}
		if a, b := build(nil, req()), build(attn, req()); !proto.Equal(a, b) {
			t.Errorf("%s layer: attn_logit_softcapping changed the graph", kind)
		}
	}
}

// conditional wraps tinyConfig as a Gemma3ForConditionalGeneration
// config.json (model_type gemma3, the text fields in text_config), with top
// as its top-level fields.
func conditional(t *testing.T, top map[string]any, text func(map[string]any)) *pb.Model {
	t.Helper()
	cfg := plugintest.Config(t, `{"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
		"vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32}, "image_token_index": 262144}`,
		func(m map[string]any) {
			var sub map[string]any
			if err := json.Unmarshal(plugintest.Config(t, tinyConfig, text), &sub); err != nil {
				t.Fatal(err)
			}
			m["text_config"] = sub
			for k, v := range top {
				m[k] = v
			}
		})
	model := plugintest.Model(t, plugin, cfg, "F32")
	if len(model.Tensors) == 0 {
		t.Fatal("the conditional config was refused")
	}
	// The vision tower is in the checkpoint but not exported.
	model.Tensors = append(model.Tensors, &pb.TensorInfo{Key: "vision_tower.vision_model.post_layernorm.weight", Dtype: "F32", Shape: []int64{32}})
	return model
}

// Gemma3ForConditionalGeneration's language model: its keys under
// language_model.model., the untied head language_model.lm_head.weight,
// tie_word_embeddings read at the top level, final_logit_softcapping not
// applied.
func TestConditional(t *testing.T) {
	parts := func(model *pb.Model) []map[int32]plugintest.Bindings {
		if ok, reasons := plugintest.Check(t, plugin, model); !ok {
			t.Fatalf("refused: %s", reasons)
		}
		return plugintest.RequireBound(t, plugin, model,
			&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
			&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindSliding, Layers: []int32{0, 2}},
			&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindFull, Layers: []int32{1}},
			&pb.BuildRequest{Part: sdk.PartFinal})
	}
	// text_config's tie_word_embeddings (true in tinyConfig) is not the one read.
	untied := parts(conditional(t, map[string]any{"tie_word_embeddings": false}, nil))
	if got := untied[2][2]["self_attn.q_norm.weight"]; !slices.Equal(got, []string{"language_model.model.layers.2.self_attn.q_norm.weight"}) {
		t.Errorf("layer 2 q_norm bound to %v", got)
	}
	if got := untied[4][sdk.NonLayer]["lm_head.weight"]; !slices.Equal(got, []string{"language_model.lm_head.weight"}) {
		t.Errorf("untied head bound to %v", got)
	}
	tied := parts(conditional(t, nil, func(m map[string]any) { m["tie_word_embeddings"] = false }))
	if got := tied[4][sdk.NonLayer]["lm_head.weight"]; !slices.Equal(got, []string{"language_model.model.embed_tokens.weight"}) {
		t.Errorf("head bound to %v, want the tied embedding (top-level default)", got)
	}
	final := func(model *pb.Model) *pb.BuildResponse {
		resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartFinal})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	capped := conditional(t, nil, func(m map[string]any) { m["final_logit_softcapping"] = 3.0 })
	if !proto.Equal(final(capped), final(conditional(t, nil, nil))) {
		t.Error("final_logit_softcapping changed Gemma3ForConditionalGeneration's final part")
	}
}

// Every layout transformers loads a Gemma3ForConditionalGeneration from
// binds the language model where that checkpoint holds it, head included;
// a checkpoint in two layouts, or in none, is refused naming them.
func TestConditionalLayouts(t *testing.T) {
	hub := conditional(t, map[string]any{"tie_word_embeddings": false}, nil) // language_model.model., language_model.lm_head.
	bind := func(model *pb.Model) []map[int32]plugintest.Bindings {
		t.Helper()
		if ok, reasons := plugintest.Check(t, plugin, model); !ok {
			t.Fatalf("refused: %s", reasons)
		}
		return plugintest.RequireBound(t, plugin, model, &pb.BuildRequest{Part: sdk.PartEmbed},
			&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindFull, Layers: []int32{1}}, &pb.BuildRequest{Part: sdk.PartFinal})
	}
	for _, prefix := range mmPrefixes {
		for _, head := range mmHeads {
			t.Run(prefix+head, func(t *testing.T) {
				bound := bind(plugintest.Rekeyed(hub, "language_model.model.", prefix, "language_model.lm_head.weight", head))
				if got := bound[0][sdk.NonLayer]["embed_tokens.weight"]; !slices.Equal(got, []string{prefix + "embed_tokens.weight"}) {
					t.Errorf("embeddings bound to %v", got)
				}
				if got := bound[1][1]["self_attn.q_proj.weight"]; !slices.Equal(got, []string{prefix + "layers.1.self_attn.q_proj.weight"}) {
					t.Errorf("layer 1 q_proj bound to %v", got)
				}
				if got := bound[2][sdk.NonLayer]["lm_head.weight"]; !slices.Equal(got, []string{head}) {
					t.Errorf("head bound to %v, want %s", got, head)
				}
			})
		}
	}
	refused := func(name string, model *pb.Model, want ...string) {
		t.Run(name, func(t *testing.T) {
			ok, reasons := plugintest.Check(t, plugin, model)
			for _, w := range want {
				if ok || !strings.Contains(reasons, w) {
					t.Errorf("supported=%v reasons=%q, want %q", ok, reasons, w)
				}
			}
		})
	}
	mem := plugintest.Rekeyed(hub, "language_model.model.", "model.language_model.")
	both := &pb.Model{ConfigJson: hub.ConfigJson, Tensors: append(slices.Clone(hub.Tensors), mem.Tensors...)}
	refused("two layouts", both, "holds gemma3's decoder layers twice, under language_model.model.layers.*, model.language_model.layers.*: keep one layout")
	refused("no layout", plugintest.Rekeyed(hub, "language_model.model.", "text.model."),
		"under none of the prefixes read (language_model.model.layers.*, model.language_model.layers.*, language_model.layers.*",
		"its keys start with language_model., text., vision_tower.")
	heads := plugintest.Rekeyed(hub, "language_model.lm_head.", "lm_head.")
	heads.Tensors = append(heads.Tensors, hub.Tensors...)
	refused("two heads", plugintest.Rekeyed(heads, "language_model.model.", "model.language_model."),
		"holds the untied head twice, as language_model.lm_head.weight and lm_head.weight")
	headless := plugintest.Rekeyed(hub, "language_model.lm_head.", "gone.")
	refused("no head", headless, "holds the head under none of language_model.lm_head.weight, lm_head.weight")
}
