package gptoss

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/hf"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// tinyConfig is shaped like transformers 5's save of a GptOssConfig.
const tinyConfig = `{"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 64,
	"intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
	"head_dim": 16, "vocab_size": 128, "rms_norm_eps": 1e-5, "num_local_experts": 4, "num_experts_per_tok": 2,
	"sliding_window": 4, "attention_bias": true, "swiglu_limit": 7.0, "max_position_embeddings": 128,
	"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
	"rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
		"beta_slow": 1.0, "original_max_position_embeddings": 16, "truncate": false}}`

// tinyModel is a config, edited by edit, with the tensors it implies in the
// given expert layout (MXFP4 blocks and scales U8, the rest BF16).
func tinyModel(t *testing.T, layout expertLayout, edit func(map[string]any)) *pb.Model {
	t.Helper()
	var seeds []*pb.TensorInfo
	for l := range 4 {
		key := func(name string) string { return layerKey(int32(l), name) }
		if layout == mxfp4 {
			seeds = append(seeds,
				&pb.TensorInfo{Key: key(gateUp + "_blocks"), Dtype: "U8", Shape: []int64{4, 64, 2, 16}},
				&pb.TensorInfo{Key: key(gateUp + "_scales"), Dtype: "U8", Shape: []int64{4, 64, 2}},
				&pb.TensorInfo{Key: key(down + "_blocks"), Dtype: "U8", Shape: []int64{4, 64, 1, 16}},
				&pb.TensorInfo{Key: key(down + "_scales"), Dtype: "U8", Shape: []int64{4, 64, 1}})
		} else {
			seeds = append(seeds, &pb.TensorInfo{Key: key(gateUp), Shape: []int64{4, 64, 64}})
		}
	}
	m := plugintest.Edited(t, plugin, tinyConfig, edit, "BF16", seeds...)
	for _, ti := range m.Tensors {
		if strings.HasSuffix(ti.Key, "_blocks") || strings.HasSuffix(ti.Key, "_scales") {
			ti.Dtype = "U8"
		}
	}
	return m
}

func layerKey(l int32, name string) string { return fmt.Sprintf("model.layers.%d.%s", l, name) }

func check(t *testing.T, m *pb.Model) (bool, string) { return plugintest.Check(t, plugin, m) }

func TestConfigErrors(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"no sliding_window": {func(m map[string]any) { delete(m, "sliding_window") },
			"sliding_window is missing (or null), but layer_types names sliding_attention layers"},
		"null sliding_window": {func(m map[string]any) { m["sliding_window"] = nil }, "sliding_window is missing"},
		"zero sliding_window": {func(m map[string]any) { m["sliding_window"] = 0 }, "sliding_window must be positive, got 0"},
		"no window, no types": {func(m map[string]any) { delete(m, "sliding_window"); delete(m, "layer_types") },
			"sliding_window is missing"},
		"layer_types short": {func(m map[string]any) { m["layer_types"] = []string{"full_attention"} },
			"layer_types has 1 entries; num_hidden_layers is 4"},
		"layer_types long": {func(m map[string]any) { m["layer_types"] = slices.Repeat([]string{"full_attention"}, 5) },
			"layer_types has 5 entries; num_hidden_layers is 4"},
		"layer_types unknown": {func(m map[string]any) {
			m["layer_types"] = []string{"sliding_attention", "chunked_attention", "full_attention", "full_attention"}
		}, `layer_types[1] is "chunked_attention"`},
		"layer_types not strings": {func(m map[string]any) { m["layer_types"] = []int{1, 2, 3, 4} }, `"layer_types"`},
		"top-k too big":           {func(m map[string]any) { m["num_experts_per_tok"] = 5 }, "num_experts_per_tok 5 must be in 1..num_local_experts (4)"},
		"no experts":              {func(m map[string]any) { delete(m, "num_local_experts") }, `"num_local_experts"`},
		"other quantization": {func(m map[string]any) { m["quantization_config"] = map[string]any{"quant_method": "fp8"} },
			`quant_method "fp8" is not supported`},
		"swiglu_limit":  {func(m map[string]any) { m["swiglu_limit"] = -1 }, "swiglu_limit must be a finite number > 0"},
		"bad rope type": {func(m map[string]any) { m["rope_parameters"].(map[string]any)["rope_type"] = "ntk" }, `rope type "ntk"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ok, reasons := check(t, tinyModel(t, fused, tc.edit))
			if ok || !strings.Contains(reasons, tc.want) {
				t.Errorf("supported=%v reasons=%q, want unsupported because %q", ok, reasons, tc.want)
			}
		})
	}
}

func edited(t *testing.T, layout expertLayout, edit func(m *pb.Model)) func(t *testing.T) *pb.Model {
	return func(t *testing.T) *pb.Model {
		m := tinyModel(t, layout, nil)
		edit(m)
		return m
	}
}

func tensor(m *pb.Model, key string) *pb.TensorInfo {
	for _, ti := range m.Tensors {
		if ti.Key == key {
			return ti
		}
	}
	panic(key)
}

func TestExpertLayouts(t *testing.T) {
	scales := layerKey(2, down+"_scales")
	cases := map[string]struct {
		model func(t *testing.T) *pb.Model
		want  string // error, or "" for supported
	}{
		"mxfp4": {func(t *testing.T) *pb.Model { return tinyModel(t, mxfp4, nil) }, ""},
		"fused": {func(t *testing.T) *pb.Model { return tinyModel(t, fused, nil) }, ""},
		"scales dtype": {edited(t, mxfp4, func(m *pb.Model) { tensor(m, scales).Dtype = "BF16" }),
			"tensor model.layers.2.mlp.experts.down_proj_scales is BF16; MXFP4 scales must be U8"},
		"blocks dtype": {edited(t, mxfp4, func(m *pb.Model) { tensor(m, layerKey(0, gateUp+"_blocks")).Dtype = "I8" }),
			"tensor model.layers.0.mlp.experts.gate_up_proj_blocks is I8; MXFP4 blocks must be U8"},
		"scales disagree": {edited(t, mxfp4, func(m *pb.Model) { tensor(m, scales).Shape = []int64{4, 32, 1} }),
			"MXFP4 blocks model.layers.2.mlp.experts.down_proj_blocks [4 64 1 16] and scales model.layers.2.mlp.experts.down_proj_scales [4 32 1] disagree"},
		"blocks misshapen": {edited(t, mxfp4, func(m *pb.Model) {
			tensor(m, layerKey(1, gateUp+"_blocks")).Shape = []int64{4, 32, 2, 16}
			tensor(m, layerKey(1, gateUp+"_scales")).Shape = []int64{4, 32, 2}
		}), "tensor model.layers.1.mlp.experts.gate_up_proj_blocks has shape [4 32 2 16]; config.json implies [4 64 2 16]"},
		"scales missing": {edited(t, mxfp4, func(m *pb.Model) {
			m.Tensors = slices.DeleteFunc(m.Tensors, func(ti *pb.TensorInfo) bool { return ti.Key == scales })
		}), "layer 2 has model.layers.2.mlp.experts.down_proj_blocks but no model.layers.2.mlp.experts.down_proj_scales"},
		"experts missing": {edited(t, fused, func(m *pb.Model) {
			m.Tensors = slices.DeleteFunc(m.Tensors, func(ti *pb.TensorInfo) bool { return strings.Contains(ti.Key, "layers.3.mlp.experts") })
		}), "layer 3 holds neither MXFP4 experts"},
		"fused misshapen": {edited(t, fused, func(m *pb.Model) { tensor(m, layerKey(1, gateUp)).Shape = []int64{4, 64, 32} }),
			"model.layers.1.mlp.experts.gate_up_proj"},
		"bias missing": {edited(t, mxfp4, func(m *pb.Model) {
			m.Tensors = slices.DeleteFunc(m.Tensors, func(ti *pb.TensorInfo) bool { return ti.Key == layerKey(0, gateUp+"_bias") })
		}), "model.layers.0.mlp.experts.gate_up_proj_bias"},
		"sinks missing": {edited(t, fused, func(m *pb.Model) {
			m.Tensors = slices.DeleteFunc(m.Tensors, func(ti *pb.TensorInfo) bool { return ti.Key == layerKey(3, "self_attn.sinks") })
		}), "model.layers.3.self_attn.sinks"},
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

// Layer kinds follow transformers: layer_types, else layer i slides when
// i+1 is odd; the sliding mask is a context value only when a layer slides.
func TestPlanLayerKinds(t *testing.T) {
	cases := map[string]struct {
		edit        func(map[string]any)
		want        []string
		slidingMask bool
	}{
		"layer_types": {nil, []string{kindSliding, kindFull, kindSliding, kindFull}, true},
		"default":     {func(m map[string]any) { delete(m, "layer_types") }, []string{kindSliding, kindFull, kindSliding, kindFull}, true},
		"listed": {func(m map[string]any) {
			m["layer_types"] = []string{"full_attention", "sliding_attention", "sliding_attention", "full_attention"}
		}, []string{kindFull, kindSliding, kindSliding, kindFull}, true},
		"all full, no window": {func(m map[string]any) {
			m["layer_types"] = slices.Repeat([]string{"full_attention"}, 4)
			delete(m, "sliding_window")
		}, []string{kindFull, kindFull, kindFull, kindFull}, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			plan, got := plugintest.Kinds(t, plugin, tinyModel(t, mxfp4, tc.edit), nil)
			if !slices.Equal(got, tc.want) {
				t.Errorf("kinds %v, want %v", got, tc.want)
			}
			if slices.Contains(plan.GetContextOutputs(), ctxSlidingMask) != tc.slidingMask {
				t.Errorf("context outputs %v; sliding mask wanted: %v", plan.GetContextOutputs(), tc.slidingMask)
			}
		})
	}
}

// attention_bias false drops all four attention biases (o_proj's too, as
// transformers has it); the experts' and router's biases stay.
func TestNoAttentionBias(t *testing.T) {
	m := tinyModel(t, mxfp4, func(c map[string]any) { c["attention_bias"] = false })
	if ok, reasons := check(t, m); !ok {
		t.Fatal(reasons)
	}
	for _, ti := range m.Tensors {
		if strings.Contains(ti.Key, "self_attn") && strings.HasSuffix(ti.Key, ".bias") {
			t.Errorf("%s expected without attention_bias", ti.Key)
		}
	}
	if !slices.ContainsFunc(m.Tensors, func(ti *pb.TensorInfo) bool { return ti.Key == layerKey(0, "mlp.router.bias") }) {
		t.Error("the router bias is not expected")
	}
}

// Absent fields take GptOssConfig's defaults: head_dim 64, 8 KV heads.
func TestConfigDefaults(t *testing.T) {
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: tinyModel(t, fused, func(c map[string]any) {
		delete(c, "head_dim")
		delete(c, "num_key_value_heads")
		c["num_attention_heads"] = 16
	})})
	if err != nil {
		t.Fatal(err)
	}
	shape := plan.GetKinds()[0].GetCaches()[0].GetShape()
	if shape[1].GetSize() != 8 || shape[3].GetSize() != 64 {
		t.Errorf("cache shape %v, want [batch_size, 8, ctx_len, 64]", shape)
	}
	ok, reasons := check(t, tinyModel(t, fused, func(c map[string]any) { delete(c, "num_key_value_heads") }))
	if ok || !strings.Contains(reasons, "config.json omits num_key_value_heads: model_type gpt_oss's default is 8") {
		t.Errorf("4 heads, default 8 KV heads: supported=%v %q", ok, reasons)
	}
}

// Without rope settings, GptOssConfig's default applies: yarn, factor 32,
// original 4096, truncate false, theta 150000, attention factor 1 + 0.1 ln 32.
func TestDefaultRoPE(t *testing.T) {
	model := func(cfg string) *decoder.Model {
		c, err := hf.Parse([]byte(cfg))
		if err != nil {
			t.Fatal(err)
		}
		if c, _, err = c.WithDefaults(defaults); err != nil {
			t.Fatal(err)
		}
		r, err := blocks.RoPEFromConfig(c, 16)
		if err != nil {
			t.Fatal(err)
		}
		return &decoder.Model{Common: decoder.Common{RoPE: r}}
	}
	r := model(`{}`).RoPE
	if r.Type != "yarn" || r.Base != 150000 || r.Factor != 32 || r.OriginalMaxPositions != 4096 || r.Truncate ||
		r.BetaFast != 32 || r.BetaSlow != 1 || r.Dim != 16 || math.Abs(r.AttentionScaling-1.3465735902799727) > 1e-12 {
		t.Errorf("default rope %+v", r)
	}
	if r := model(`{"rope_theta": 20000}`).RoPE; r.Base != 20000 || r.Type != "yarn" {
		t.Errorf("rope_theta alone: %+v", r)
	}
	if r := model(`{"rope_scaling": {"rope_type": "default"}}`).RoPE; r.Type != "default" || r.Base != 150000 {
		t.Errorf("rope settings present must be left to the SDK: %+v", r)
	}
}

// Every formal input of every part is bound to tensors the checkpoint
// holds, in both layouts; MXFP4 experts read their blocks and scales.
func TestBuildBindsEveryWeight(t *testing.T) {
	for _, layout := range []expertLayout{mxfp4, fused} {
		t.Run(fmt.Sprint("layout ", layout), func(t *testing.T) {
			parts := plugintest.RequireBound(t, plugin, tinyModel(t, layout, nil),
				&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindSliding, Layers: []int32{0, 2}},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindFull, Layers: []int32{1, 3}},
				&pb.BuildRequest{Part: sdk.PartFinal})
			b := parts[3][3]
			want := map[string][]string{
				"mlp.experts.up":        {layerKey(3, gateUp)},
				"mlp.experts.down":      {layerKey(3, down)},
				"mlp.experts.gate_bias": {layerKey(3, gateUp+"_bias")},
				"mlp.experts.down_bias": {layerKey(3, down+"_bias")},
				"self_attn.sinks":       {layerKey(3, "self_attn.sinks")},
				"mlp.router.bias":       {layerKey(3, "mlp.router.bias")},
			}
			if layout == mxfp4 {
				want["mlp.experts.up"] = []string{layerKey(3, gateUp+"_blocks"), layerKey(3, gateUp+"_scales")}
				want["mlp.experts.down"] = []string{layerKey(3, down+"_blocks"), layerKey(3, down+"_scales")}
			}
			for in, keys := range want {
				if !slices.Equal(b[in], keys) {
					t.Errorf("layer 3 %s reads %v, want %v", in, b[in], keys)
				}
			}
		})
	}
}

func TestBuildRefusesWrongKind(t *testing.T) {
	_, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: tinyModel(t, fused, nil),
		Part: sdk.PartLayer, Kind: kindFull, Layers: []int32{0}})
	if err == nil || !strings.Contains(err.Error(), "layer 0 is not of kind full") {
		t.Errorf("error %v", err)
	}
}

func TestPluginOptions(t *testing.T) {
	for opt, want := range map[string]string{"dense": "", "gather": "", "sparse": `moe_strategy "sparse": use gather or dense`} {
		_, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: tinyModel(t, mxfp4, nil),
			Options: &pb.ExportOptions{PluginOptions: map[string]string{decoder.MoEStrategy: opt}}})
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: error %v, want %q", opt, err, want)
		}
	}
}
