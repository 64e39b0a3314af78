package qwen3vl

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/headeronly"
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/hf"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// Shaped like transformers 5.24's saves: text fields in text_config (which
// also carries a tie_word_embeddings transformers ignores), the top-level
// flag, num_local_experts.
const denseConfig = `{"model_type": "qwen3_vl", "tie_word_embeddings": false, "image_token_id": 151655,
	"vision_config": {"depth": 1, "hidden_size": 32},
	"text_config": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
	"num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
	"rope_parameters": {"rope_type": "default", "rope_theta": 5000000, "mrope_section": [4, 2, 2], "mrope_interleaved": true}}}`

const moeConfig_ = `{"model_type": "qwen3_vl_moe", "tie_word_embeddings": false,
	"text_config": {"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 24, "num_hidden_layers": 4,
	"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "num_local_experts": 6,
	"num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [], "tie_word_embeddings": true,
	"rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": true}, "rope_theta": 5000000}}`

func fused(lay expertLayout, e, h, i int64) []*pb.TensorInfo {
	var out []*pb.TensorInfo
	for l := range 4 {
		key := func(n string) string { return fmt.Sprintf("model.language_model.layers.%d.mlp.experts.%s", l, n) }
		gu, down := []int64{e, h, 2 * i}, []int64{e, i, h}
		if lay == layoutTransformers {
			gu, down = []int64{e, 2 * i, h}, []int64{e, h, i}
		}
		out = append(out, &pb.TensorInfo{Key: key("gate_up_proj"), Shape: gu}, &pb.TensorInfo{Key: key("down_proj"), Shape: down})
	}
	return out
}

func moeModel(t *testing.T, lay expertLayout, edit func(map[string]any)) *pb.Model {
	t.Helper()
	return plugintest.Edited(t, plugin, moeConfig_, edit, "BF16", fused(lay, 6, 64, 24)...)
}

func check(t *testing.T, m *pb.Model) (bool, string) {
	t.Helper()
	resp, err := plugin.Check(context.Background(), &pb.CheckRequest{Model: m})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetSupported(), strings.Join(resp.GetReasons(), "; ")
}

func text(edit func(map[string]any)) func(map[string]any) {
	return func(m map[string]any) { edit(m["text_config"].(map[string]any)) }
}

func TestConfigErrors(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"no text_config":   {func(m map[string]any) { delete(m, "text_config") }, `required object "text_config" is missing`},
		"not interleaved":  {text(func(m map[string]any) { m["rope_parameters"].(map[string]any)["mrope_interleaved"] = false }), "non-interleaved MRoPE"},
		"sliding window":   {text(func(m map[string]any) { m["use_sliding_window"] = true }), "full attention only"},
		"gelu":             {text(func(m map[string]any) { m["hidden_act"] = "gelu" }), `hidden_act "gelu"`},
		"bad section":      {text(func(m map[string]any) { m["rope_parameters"].(map[string]any)["mrope_section"] = []int{4, 2} }), "must be 3 sizes"},
		"tied not boolean": {func(m map[string]any) { m["tie_word_embeddings"] = "yes" }, "tie_word_embeddings"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ok, reasons := check(t, plugintest.Edited(t, plugin, denseConfig, tc.edit, "BF16"))
			if ok || !strings.Contains(reasons, tc.want) {
				t.Errorf("supported=%v reasons=%q, want %q", ok, reasons, tc.want)
			}
		})
	}
}

// tie_word_embeddings comes from the top level: text_config's true is
// ignored, so the head is lm_head.weight; a top-level true binds the
// embedding.
func TestTiedFromTopLevel(t *testing.T) {
	for _, tied := range []bool{false, true} {
		m := plugintest.Edited(t, plugin, denseConfig, func(m map[string]any) { m["tie_word_embeddings"] = tied }, "BF16")
		parts := plugintest.RequireBound(t, plugin, m, &pb.BuildRequest{Part: sdk.PartFinal})
		head := parts[0][sdk.NonLayer]["lm_head.weight"]
		want := []string{"lm_head.weight"}
		if tied {
			want = []string{"model.language_model.embed_tokens.weight"}
		}
		if !slices.Equal(head, want) {
			t.Errorf("tied=%v: head reads %v, want %v", tied, head, want)
		}
	}
}

func TestExpertOrientations(t *testing.T) {
	cases := map[string]struct {
		model func(t *testing.T) *pb.Model
		want  string
	}{
		"hub":          {func(t *testing.T) *pb.Model { return moeModel(t, layoutHub, nil) }, ""},
		"transformers": {func(t *testing.T) *pb.Model { return moeModel(t, layoutTransformers, nil) }, ""},
		"square gate_up": {func(t *testing.T) *pb.Model {
			m := moeModel(t, layoutHub, nil)
			m.ConfigJson = plugintest.Config(t, moeConfig_, text(func(m map[string]any) { m["moe_intermediate_size"] = 32 }))
			for _, ti := range m.Tensors {
				switch {
				case strings.HasSuffix(ti.Key, "experts.gate_up_proj"):
					ti.Shape = []int64{6, 64, 64}
				case strings.HasSuffix(ti.Key, "experts.down_proj"):
					ti.Shape = []int64{6, 32, 64}
				}
			}
			return m
		}, "cannot tell the Hub orientation [E, H, 2I] from transformers' [E, 2I, H]; strata refuses to guess"},
		"mixed orientations": {func(t *testing.T) *pb.Model {
			m := moeModel(t, layoutHub, nil)
			for _, ti := range m.Tensors {
				if ti.Key == "model.language_model.layers.3.mlp.experts.down_proj" {
					ti.Shape = []int64{6, 64, 24}
				}
			}
			return m
		}, "layers.3.mlp.experts.down_proj has shape [6 64 24]; with gate_up_proj [6 64 48] (fused [E,H,2I] (Hub)) it must be [6 24 64]"},
		"misshapen": {func(t *testing.T) *pb.Model {
			m := moeModel(t, layoutHub, nil)
			for _, ti := range m.Tensors {
				if ti.Key == "model.language_model.layers.1.mlp.experts.gate_up_proj" {
					ti.Shape = []int64{6, 64, 24}
				}
			}
			return m
		}, "gate_up_proj has shape [6 64 24]; config.json implies [6 64 48]"},
		"per-expert keys": {func(t *testing.T) *pb.Model {
			m := moeModel(t, layoutHub, nil)
			for _, ti := range m.Tensors {
				if ti.Key == "model.language_model.layers.1.mlp.experts.gate_up_proj" {
					ti.Key = "model.language_model.layers.1.mlp.experts.0.gate_proj.weight"
				}
			}
			return m
		}, "holds per-expert tensors"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ok, reasons := check(t, tc.model(t))
			if tc.want == "" && !ok {
				t.Fatalf("unsupported: %s", reasons)
			}
			if tc.want != "" && (ok || !strings.Contains(reasons, tc.want)) {
				t.Errorf("supported=%v reasons=%q, want %q", ok, reasons, tc.want)
			}
		})
	}
}

// Layer kinds follow transformers: sparse unless in mlp_only_layers or
// (i+1) is not a multiple of decoder_sparse_step.
func TestPlanLayerKinds(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want []string
	}{
		"step 2": {nil, []string{kindDense, kindMoE, kindDense, kindMoE}},
		"listed dense": {text(func(m map[string]any) { m["decoder_sparse_step"] = 1; m["mlp_only_layers"] = []int{0, 2} }),
			[]string{kindDense, kindMoE, kindDense, kindMoE}},
		"all sparse": {text(func(m map[string]any) { m["decoder_sparse_step"] = 1 }), []string{kindMoE, kindMoE, kindMoE, kindMoE}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, got := plugintest.Kinds(t, plugin, moeModel(t, layoutHub, tc.edit), nil)
			if !slices.Equal(got, tc.want) {
				t.Errorf("kinds %v, want %v", got, tc.want)
			}
		})
	}
}

// position_ids_rank 3: the plan asks for [3, batch, seq] and the row-0
// context value; layers read it instead of position_ids; rank 2 (default)
// has neither.
func TestPositionRank(t *testing.T) {
	for _, rank := range []string{"2", "3"} {
		opts := &pb.ExportOptions{PluginOptions: map[string]string{optPositions: rank}}
		m := moeModel(t, layoutTransformers, nil)
		plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: m, Options: opts})
		if err != nil {
			t.Fatal(err)
		}
		three := rank == "3"
		if (plan.GetPositionIdsRank() == 3) != three || slices.Contains(plan.GetContextOutputs(), decoder.CtxPositions) != three {
			t.Errorf("rank %s: plan rank %d, context %v", rank, plan.GetPositionIdsRank(), plan.GetContextOutputs())
		}
		for _, kind := range []string{kindMoE, kindDense} {
			layer := int32(1)
			if kind == kindDense {
				layer = 0
			}
			resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: m, Options: opts, Part: sdk.PartLayer, Kind: kind, Layers: []int32{layer}})
			if err != nil {
				t.Fatal(err)
			}
			in := resp.GetFunction().GetInput()
			if slices.Contains(in, sdk.PositionIDs) == three || slices.Contains(in, decoder.CtxPositions) != three {
				t.Errorf("rank %s kind %s: layer inputs %v", rank, kind, in)
			}
		}
	}
	_, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: moeModel(t, layoutHub, nil),
		Options: &pb.ExportOptions{PluginOptions: map[string]string{optPositions: "4"}}})
	if err == nil || !strings.Contains(err.Error(), `position_ids_rank "4": use 2 or 3`) {
		t.Errorf("rank 4: %v", err)
	}
}

func TestBuildBindsEveryWeight(t *testing.T) {
	for _, lay := range []expertLayout{layoutHub, layoutTransformers} {
		t.Run(lay.String(), func(t *testing.T) {
			parts := plugintest.RequireBound(t, plugin, moeModel(t, lay, nil),
				&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindDense, Layers: []int32{0, 2}},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindMoE, Layers: []int32{1, 3}},
				&pb.BuildRequest{Part: sdk.PartFinal})
			gate := parts[3][3]["mlp.experts.gate"]
			if want := []string{"model.language_model.layers.3.mlp.experts.gate_up_proj"}; !slices.Equal(gate, want) {
				t.Errorf("layer 3 gate reads %v, want %v", gate, want)
			}
		})
	}
	plugintest.RequireBound(t, plugin, plugintest.Model(t, plugin, []byte(denseConfig), "BF16"),
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindDecoder, Layers: []int32{0, 1}})
}

// The vision model is declared only when vision_config is understood and
// its tensors are present; otherwise the language model still exports and
// Check says why vision is not available.
func TestVisionModelDeclared(t *testing.T) {
	const vision = `{"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
		"temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 64, "num_position_embeddings": 16,
		"deepstack_visual_indexes": [0], "in_channels": 3, "hidden_act": "gelu_pytorch_tanh"}`
	base := plugintest.Config(t, denseConfig, func(m map[string]any) { m["vision_config"] = json.RawMessage(vision) })
	lm := plugintest.Model(t, plugin, base, "F32")
	c, err := decoder.ReadQwenVision(mustParse(t, base), 64, qwenVision)
	if err != nil {
		t.Fatal(err)
	}
	full := &pb.Model{ConfigJson: base, Tensors: slices.Clone(lm.Tensors)}
	for _, ts := range c.Tensors() {
		full.Tensors = append(full.Tensors, &pb.TensorInfo{Key: decoder.VisionPrefix + ts[0].(string), Dtype: "F32", Shape: ts[1].([]int64)})
	}
	cases := map[string]struct {
		model *pb.Model
		edit  func(map[string]any)
		want  string // a Check reason; "" when the model is declared
	}{
		"declared":       {full, nil, ""},
		"no tensors":     {lm, nil, "lacks vision tensors model.visual.patch_embed.proj.weight"},
		"unknown field":  {full, func(v map[string]any) { v["window_size"] = 112 }, "vision_config.window_size is not known"},
		"other act":      {full, func(v map[string]any) { v["hidden_act"] = "silu" }, `hidden_act "silu"`},
		"bad deepstack":  {full, func(v map[string]any) { v["deepstack_visual_indexes"] = []int{1} }, "index 1 outside 0..depth-1"},
		"not square pos": {full, func(v map[string]any) { v["num_position_embeddings"] = 15 }, "not a square"},
		// A Qwen3VLModel's save: no model. before either part.
		"base layout": {plugintest.Rekeyed(full, "model.language_model.", "language_model.", "model.visual.", "visual."), nil, ""},
		"two towers": {&pb.Model{ConfigJson: base, Tensors: append(slices.Clone(full.Tensors),
			plugintest.Rekeyed(full, "model.visual.", "visual.").Tensors[len(lm.Tensors):]...)},
			nil, "holds the vision tower twice, under model.visual.*, visual.*"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := &pb.Model{ConfigJson: tc.model.ConfigJson, Tensors: tc.model.Tensors}
			if tc.edit != nil {
				m.ConfigJson = plugintest.Config(t, string(base), func(top map[string]any) { tc.edit(top["vision_config"].(map[string]any)) })
			}
			ok, reasons := check(t, m)
			if !ok {
				t.Fatalf("the language model must stay supported: %s", reasons)
			}
			plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: m})
			if err != nil {
				t.Fatal(err)
			}
			declared := len(plan.GetModels()) == 1 && plan.GetModels()[0].GetName() == decoder.VisionModel
			if declared != (tc.want == "") || (tc.want != "" && !strings.Contains(reasons, tc.want)) {
				t.Errorf("declared=%v reasons=%q, want %q", declared, reasons, tc.want)
			}
			if declared {
				resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: m, Part: sdk.PartModel, ModelName: decoder.VisionModel})
				if err != nil {
					t.Fatal(err)
				}
				bound := map[string]bool{decoder.PixelValues: true, decoder.ImageGridTHW: true}
				for _, b := range resp.GetWeights()[0].GetBindings() {
					bound[b.GetInput()] = true
				}
				for _, in := range resp.GetFunction().GetInput() {
					if !bound[in] {
						t.Errorf("vision input %s is neither a graph input nor bound", in)
					}
				}
			}
		})
	}
}

func mustParse(t *testing.T, data []byte) hf.Config {
	t.Helper()
	c, err := hf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// visionTop is a vision_config with deepstack indexes ds, for the vision
// option's tests.
func visionTop(ds string) func(map[string]any) {
	return func(m map[string]any) {
		m["vision_config"] = json.RawMessage(`{"depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
		"temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 64, "num_position_embeddings": 16,
		"deepstack_visual_indexes": ` + ds + `, "in_channels": 3, "hidden_act": "gelu_pytorch_tanh"}`)
		m["image_token_id"] = 120
	}
}

var visionOn = &pb.ExportOptions{PluginOptions: map[string]string{optVision: "true"}}

// vision=true: position_ids [4, batch, seq], the extra inputs, DeepStack
// kinds for layers 0..D-1 (each its own function, of the layer's own base
// kind), the vision rows read where they are used; vision=false keeps the
// text-only plan.
func TestVisionInputsPlan(t *testing.T) {
	cases := map[string]struct {
		model *pb.Model
		kinds []string // of each layer
	}{
		"dense, D 1": {plugintest.Edited(t, plugin, denseConfig, visionTop("[0]"), "BF16"),
			[]string{"decoder_deepstack0", "decoder"}},
		"moe, D 2": {moeModel(t, layoutHub, visionTop("[0, 2]")),
			[]string{"dense_deepstack0", "moe_deepstack1", "dense", "moe"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			plan, kinds := plugintest.Kinds(t, plugin, tc.model, visionOn)
			var extra []string
			for _, x := range plan.GetExtraInputs() {
				extra = append(extra, x.GetName())
			}
			d := int64(slices.IndexFunc(kinds, func(k string) bool { return !strings.Contains(k, "deepstack") }))
			switch {
			case !slices.Equal(kinds, tc.kinds):
				t.Errorf("kinds %v, want %v", kinds, tc.kinds)
			case plan.GetPositionIdsRank() != 3 || plan.GetPositionRows() != 4:
				t.Errorf("position_ids rank %d rows %d, want [4, batch, seq]", plan.GetPositionIdsRank(), plan.GetPositionRows())
			case !slices.Equal(extra, []string{sdk.InputIDs, decoder.VisionEmbeds, decoder.DeepstackFeatures}):
				t.Errorf("extra inputs %v", extra)
			case plan.GetExtraInputs()[2].GetShape()[0].GetSize() != d:
				t.Errorf("deepstack_features %v, want %d rows first", plan.GetExtraInputs()[2].GetShape(), d)
			case !slices.Contains(plan.GetContextOutputs(), decoder.CtxVisionIndex) || !slices.Contains(plan.GetContextOutputs(), decoder.CtxVisionCount):
				t.Errorf("context outputs %v", plan.GetContextOutputs())
			}
			reqs := []*pb.BuildRequest{{Part: sdk.PartEmbed}, {Part: sdk.PartContext}, {Part: sdk.PartFinal}}
			for i, k := range kinds {
				reqs = append(reqs, &pb.BuildRequest{Part: sdk.PartLayer, Kind: k, Layers: []int32{int32(i)}})
			}
			for _, r := range reqs {
				r.Model, r.Options = tc.model, visionOn
			}
			plugintest.RequireBound(t, plugin, tc.model, reqs...)
			for _, r := range reqs {
				resp, err := plugin.Build(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				in, fname := resp.GetFunction().GetInput(), resp.GetFunction().GetName()
				deep := strings.Contains(r.GetKind(), "deepstack")
				want := map[string]bool{
					decoder.VisionEmbeds:      r.GetPart() == sdk.PartEmbed,
					decoder.DeepstackFeatures: deep,
					decoder.CtxVisionIndex:    deep,
					sdk.InputIDs:              r.GetPart() == sdk.PartEmbed || r.GetPart() == sdk.PartContext,
				}
				for name, w := range want {
					if slices.Contains(in, name) != w {
						t.Errorf("%s %s: inputs %v, %s wanted: %v", r.GetPart(), r.GetKind(), in, name, w)
					}
				}
				if deep && !strings.HasSuffix(fname, fmt.Sprintf("Deepstack%c", r.GetKind()[len(r.GetKind())-1])) {
					t.Errorf("kind %s is function %s", r.GetKind(), fname)
				}
			}
		})
	}
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: moeModel(t, layoutHub, visionTop("[0, 2]"))})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.GetExtraInputs()) != 0 || plan.GetPositionRows() != 0 || plan.GetPositionIdsRank() == 3 || plan.GetLayers()[0].GetKind() != kindDense {
		t.Errorf("vision=false: extra inputs %v, rows %d, rank %d, layer 0 %s", plan.GetExtraInputs(), plan.GetPositionRows(),
			plan.GetPositionIdsRank(), plan.GetLayers()[0].GetKind())
	}
}

func TestVisionInputsErrors(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"no image token": {func(m map[string]any) { visionTop("[0]")(m); delete(m, "image_token_id") }, "--vision true needs the image token"},
		"no vision tower": {func(m map[string]any) { visionTop("[0]")(m); delete(m, "vision_config") },
			"--vision true needs the vision tower's config"},
		"more deepstack than layers": {visionTop("[0, 1, 2]"), "3 entries, more than the 2 decoder layers"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := plugintest.Edited(t, plugin, denseConfig, tc.edit, "BF16")
			_, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: m, Options: visionOn})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// The Qwen3-VL-235B-A22B release (bench/configs, header-only tensors as
// it stores them) plans with vision inputs: 94 layers, its three DeepStack
// indexes on layers 0..2, hidden 4096, and Check still supports it.
func TestVisionInputs235B(t *testing.T) {
	config, err := os.ReadFile("../../bench/configs/qwen3-vl-235b-a22b/config.json")
	if err != nil {
		t.Fatal(err)
	}
	tensors, err := headeronly.Tensors(config, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	m := &pb.Model{ConfigJson: config}
	for _, x := range tensors {
		m.Tensors = append(m.Tensors, &pb.TensorInfo{Key: x.Name, Dtype: x.DType, Shape: x.Shape})
	}
	if ok, reasons := check(t, m); !ok {
		t.Fatal(reasons)
	}
	plan, kinds := plugintest.Kinds(t, plugin, m, visionOn)
	deep := plan.GetExtraInputs()[2].GetShape()
	if len(plan.GetLayers()) != 94 || !slices.Equal(kinds[:4], []string{"moe_deepstack0", "moe_deepstack1", "moe_deepstack2", "moe"}) ||
		deep[0].GetSize() != 3 || deep[2].GetSize() != 4096 || plan.GetPositionRows() != 4 {
		t.Errorf("%d layers, kinds %v, deepstack_features %v, rows %d", len(plan.GetLayers()), kinds, deep, plan.GetPositionRows())
	}
}

// The language model binds where each layout transformers loads puts it.
func TestLanguageModelLayouts(t *testing.T) {
	saved := plugintest.Model(t, plugin, []byte(denseConfig), "F32")
	for _, prefix := range lmPrefixes {
		t.Run(prefix, func(t *testing.T) {
			model := plugintest.Rekeyed(saved, "model.language_model.", prefix)
			if ok, reasons := check(t, model); !ok {
				t.Fatalf("refused: %s", reasons)
			}
			bound := plugintest.RequireBound(t, plugin, model, &pb.BuildRequest{Part: sdk.PartEmbed},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindDecoder, Layers: []int32{0}}, &pb.BuildRequest{Part: sdk.PartFinal})
			if got := bound[1][0]["self_attn.q_proj.weight"]; !slices.Equal(got, []string{prefix + "layers.0.self_attn.q_proj.weight"}) {
				t.Errorf("q_proj bound to %v", got)
			}
		})
	}
}
