package qwen35

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const denseConfig = `{"model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
	"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 128,
	"layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
	"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
	"linear_conv_kernel_dim": 4, "rope_parameters": {"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.25}}`

const nextConfig = `{"model_type": "qwen3_next", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
	"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
	"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
	"linear_conv_kernel_dim": 4, "full_attention_interval": 2, "num_experts": 4, "num_experts_per_tok": 2,
	"moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "mlp_only_layers": [1]}`

// Layer 0 is linear; the plan gives each layer type its caches, sized by
// the config (conv channels 2·2·16 + 4·8 = 96, kernel 4), not by ctx_len.
func TestPlanKindsAndCaches(t *testing.T) {
	model := plugintest.Edited(t, plugin, denseConfig, nil, "F32")
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: &pb.ExportOptions{ContinuousBatching: true}})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, l := range plan.GetLayers() {
		kinds = append(kinds, l.GetKind())
	}
	if got := strings.Join(kinds, " "); got != "linear_dense linear_dense full_dense linear_dense" {
		t.Errorf("layer kinds %s", got)
	}
	shapes := map[string]string{}
	for _, k := range plan.GetKinds() {
		for _, c := range k.GetCaches() {
			shapes[k.GetName()+"/"+c.GetName()] = dims(c.GetShape())
		}
	}
	want := map[string]string{
		"linear_dense/conv_state": "full_batch_size 96 4", "linear_dense/recurrent_state": "full_batch_size 4 16 8",
		"full_dense/past_key": "full_batch_size 2 ctx_len 32", "full_dense/past_value": "full_batch_size 2 ctx_len 32",
	}
	for k, v := range want {
		if shapes[k] != v {
			t.Errorf("%s: %q, want %q", k, shapes[k], v)
		}
	}
}

func dims(ds []*pb.Dim) string {
	var out []string
	for _, d := range ds {
		if d.GetParam() != "" {
			out = append(out, d.GetParam())
		} else {
			out = append(out, strconv.FormatInt(d.GetSize(), 10))
		}
	}
	return strings.Join(out, " ")
}

// Every part binds every formal input; Qwen3-Next's q, k, v, z, b, a come
// from its fused in-projections, the gated query from q_proj.
func TestBuildBindsEveryWeight(t *testing.T) {
	cases := map[string]struct {
		config string
		seeds  []*pb.TensorInfo
		kinds  []string
		check  map[string]string // formal input of layer 0's first kind -> a key it reads
	}{
		"qwen3_5_text": {config: denseConfig, kinds: []string{"linear_dense", "full_dense"},
			check: map[string]string{"linear_attn.in_proj_qkv.weight": "model.layers.0.linear_attn.in_proj_qkv.weight"}},
		"qwen3_next": {config: nextConfig, kinds: []string{"linear_moe", "full_dense"},
			seeds: []*pb.TensorInfo{{Key: "model.layers.0." + decoder.ExpertName(0, "gate_proj")}, {Key: "model.layers.0." + decoder.ExpertName(3, "gate_proj")}},
			check: map[string]string{
				"linear_attn.in_proj_qkv.weight": "model.layers.0.linear_attn.in_proj_qkvz.weight",
				"linear_attn.in_proj_b.weight":   "model.layers.0.linear_attn.in_proj_ba.weight",
				"mlp.shared_expert_gate.weight":  "model.layers.0.mlp.shared_expert_gate.weight",
			}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tc.config, nil, "F32", tc.seeds...)
			reqs := []*pb.BuildRequest{{Part: sdk.PartEmbed}, {Part: sdk.PartContext}, {Part: sdk.PartFinal}}
			plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model})
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range tc.kinds {
				var layers []int32
				for _, l := range plan.GetLayers() {
					if l.GetKind() == k {
						layers = append(layers, l.GetIndex())
					}
				}
				reqs = append(reqs, &pb.BuildRequest{Part: sdk.PartLayer, Kind: k, Layers: layers})
			}
			parts := plugintest.RequireBound(t, plugin, model, reqs...)
			for in, key := range tc.check {
				if got := parts[3][0][in]; len(got) == 0 || got[0] != key {
					t.Errorf("%s bound to %v, want %s first", in, got, key)
				}
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"unknown layer type": {func(m map[string]any) {
			m["layer_types"] = []string{"linear_attention", "sliding_attention", "full_attention", "linear_attention"}
		}, `layer_types[1] is "sliding_attention"`},
		"layer types short":  {func(m map[string]any) { m["layer_types"] = []string{"full_attention"} }, "layer_types lists 1 layers"},
		"value heads":        {func(m map[string]any) { m["linear_num_value_heads"] = 3 }, "must be a multiple of linear_num_key_heads"},
		"sliding window":     {func(m map[string]any) { m["use_sliding_window"] = true }, "use_sliding_window is set"},
		"gelu":               {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu" is not supported by the qwen35 plugin`},
		"no output gate":     {func(m map[string]any) { m["attn_output_gate"] = false }, "attn_output_gate is false"},
		"sigmoid norm gate":  {func(m map[string]any) { m["output_gate_type"] = "sigmoid" }, `output_gate_type "sigmoid"`},
		"no conv kernel":     {func(m map[string]any) { delete(m, "linear_conv_kernel_dim") }, "linear_conv_kernel_dim"},
		"zero interval":      {func(m map[string]any) { delete(m, "layer_types"); m["full_attention_interval"] = 0 }, "full_attention_interval must be positive"},
		"odd rotary default": {func(m map[string]any) { delete(m, "rope_parameters"); m["head_dim"] = 36 }, "default partial_rotary_factor 0.25"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, denseConfig, nil, "F32")
			model.ConfigJson = plugintest.Config(t, denseConfig, tc.edit)
			resp, err := plugin.Check(context.Background(), &pb.CheckRequest{Model: model})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetSupported() || !strings.Contains(strings.Join(resp.GetReasons(), ";"), tc.want) {
				t.Errorf("supported=%v reasons=%v, want %q", resp.GetSupported(), resp.GetReasons(), tc.want)
			}
		})
	}
}

// Without layer_types, every full_attention_interval-th layer is full, as
// transformers derives it.
func TestLayerTypesFromInterval(t *testing.T) {
	model := plugintest.Edited(t, plugin, nextConfig, nil, "F32",
		&pb.TensorInfo{Key: "model.layers.0." + decoder.ExpertName(0, "gate_proj")}, &pb.TensorInfo{Key: "model.layers.0." + decoder.ExpertName(3, "gate_proj")})
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model})
	if err != nil {
		t.Fatal(err)
	}
	if k0, k1 := plan.GetLayers()[0].GetKind(), plan.GetLayers()[1].GetKind(); k0 != "linear_moe" || k1 != "full_dense" {
		t.Errorf("kinds %s, %s; want linear_moe (sparse), full_dense (mlp_only_layers)", k0, k1)
	}
}

// mtp.* keys are an indexed MTP layout, left out of the export and said so.
func TestMTPLayout(t *testing.T) {
	model := plugintest.Edited(t, plugin, denseConfig, func(c map[string]any) { c["mtp_num_hidden_layers"] = 1 }, "F32")
	model.Tensors = append(model.Tensors, &pb.TensorInfo{Key: "mtp.fc.weight", Shape: []int64{64, 128}, Dtype: "F32"},
		&pb.TensorInfo{Key: "mtp.layers.0.input_layernorm.weight", Shape: []int64{64}, Dtype: "F32"})
	check, err := plugin.Check(context.Background(), &pb.CheckRequest{Model: model})
	if err != nil || !check.GetSupported() {
		t.Fatalf("check: %v %v", err, check.GetReasons())
	}
	if got := strings.Join(check.GetReasons(), ";"); !strings.Contains(got, "MTP weights (2 mtp.* tensors; mtp_num_hidden_layers 1) are left out of the export (--mtp draft") {
		t.Errorf("notes %q", got)
	}
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model})
	if err != nil {
		t.Fatal(err)
	}
	if m := plan.GetMtp(); m.GetConvention() != "indexed" || strings.Join(m.GetKeys(), " ") != "mtp.fc.weight mtp.layers.0.input_layernorm.weight" {
		t.Errorf("mtp layout %v", m)
	}
}
