package glm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// tinyConfig is shaped like transformers 5's save of a Glm4MoeConfig
// (num_nextn_predict_layers 1 with no MTP weight, as save_pretrained writes).
const tinyConfig = `{"model_type": "glm4_moe", "hidden_size": 64, "intermediate_size": 96,
	"moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
	"head_dim": 16, "vocab_size": 128, "rms_norm_eps": 1e-5, "n_routed_experts": 12, "num_experts_per_tok": 4,
	"n_shared_experts": 2, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "norm_topk_prob": true,
	"routed_scaling_factor": 2.5, "use_qk_norm": true, "attention_bias": true, "num_nextn_predict_layers": 1,
	"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.5}}`

func tinyModel(t *testing.T, edit func(map[string]any)) *pb.Model {
	t.Helper()
	var seeds []*pb.TensorInfo
	for l := 0; l < 3; l++ {
		seeds = append(seeds, &pb.TensorInfo{Key: layerKey(int32(l), decoder.ExpertName(0, "gate_proj"))},
			&pb.TensorInfo{Key: layerKey(int32(l), decoder.ExpertName(11, "gate_proj"))})
	}
	return plugintest.Edited(t, plugin, tinyConfig, edit, "BF16", seeds...)
}

// withMTP is tinyModel plus an inlined MTP layer 3 (a MoE layer and the
// NextN tensors), as the GLM-4.x releases store it; own adds the layer's
// embed_tokens and shared_head.head.
func withMTP(t *testing.T, own bool, edit func(map[string]any)) *pb.Model {
	t.Helper()
	four := plugintest.Config(t, tinyConfig, func(m map[string]any) { m["num_hidden_layers"] = 4; m["num_nextn_predict_layers"] = 0 })
	var seeds []sdk.ExpectedTensor
	for l := 1; l < 4; l++ {
		seeds = append(seeds, sdk.ExpectedTensor{Key: layerKey(int32(l), decoder.ExpertName(0, "gate_proj"))},
			sdk.ExpectedTensor{Key: layerKey(int32(l), decoder.ExpertName(11, "gate_proj"))})
	}
	expected, err := plugin.ExpectedTensors(plugintest.FromTensors(four, seeds, "BF16"))
	if err != nil {
		t.Fatal(err)
	}
	tensors := slices.Clone(expected)
	for _, n := range []string{"enorm.weight", "hnorm.weight", "shared_head.norm.weight"} {
		tensors = append(tensors, sdk.ExpectedTensor{Key: layerKey(3, n), Shape: []int64{64}})
	}
	tensors = append(tensors, sdk.ExpectedTensor{Key: layerKey(3, "eh_proj.weight"), Shape: []int64{64, 128}})
	if own {
		tensors = append(tensors, sdk.ExpectedTensor{Key: layerKey(3, "embed_tokens.weight"), Shape: []int64{128, 64}},
			sdk.ExpectedTensor{Key: layerKey(3, "shared_head.head.weight"), Shape: []int64{128, 64}})
	}
	return plugintest.FromTensors(plugintest.Config(t, tinyConfig, edit), tensors, "BF16")
}

func check(t *testing.T, m *pb.Model, opts map[string]string) (supported bool, reasons string) {
	t.Helper()
	if opts != nil { // Check has no options; Plan does
		_, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: m, Options: &pb.ExportOptions{PluginOptions: opts}})
		if err != nil {
			return false, err.Error()
		}
	}
	resp, err := plugin.Check(context.Background(), &pb.CheckRequest{Model: m})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetSupported(), strings.Join(resp.GetReasons(), ";")
}

func TestConfigErrors(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"groups do not divide": {func(m map[string]any) { m["n_group"] = 5 }, "n_group 5 must divide n_routed_experts (12)"},
		"topk_group > n_group": {func(m map[string]any) { m["topk_group"] = 5 }, "topk_group 5 must be in 1..n_group (4)"},
		"top-k beyond groups":  {func(m map[string]any) { m["topk_group"] = 1 }, "num_experts_per_tok 4 exceeds the experts of the topk_group 1 groups kept (3)"},
		"group of one":         {func(m map[string]any) { m["n_group"] = 12; m["topk_group"] = 4 }, "leaves 1 expert per group"},
		"top-k too big":        {func(m map[string]any) { m["num_experts_per_tok"] = 13 }, "num_experts_per_tok 13 must be in 1..n_routed_experts (12)"},
		"no experts":           {func(m map[string]any) { delete(m, "n_routed_experts") }, `"n_routed_experts"`},
		"no moe size":          {func(m map[string]any) { delete(m, "moe_intermediate_size") }, `"moe_intermediate_size" is missing`},
		"scaling":              {func(m map[string]any) { m["routed_scaling_factor"] = 0 }, "routed_scaling_factor must be > 0"},
		"nextn negative":       {func(m map[string]any) { m["num_nextn_predict_layers"] = -1 }, "num_nextn_predict_layers must be ≥ 0"},
		"gelu":                 {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ok, reasons := check(t, tinyModel(t, tc.edit), nil)
			if ok || !strings.Contains(reasons, tc.want) {
				t.Errorf("supported=%v reasons=%q, want unsupported because %q", ok, reasons, tc.want)
			}
		})
	}
}

func TestPlanKindsAndRoPE(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want []string
	}{
		"first dense":  {nil, []string{kindDense, kindMoE, kindMoE}},
		"two dense":    {func(m map[string]any) { m["first_k_dense_replace"] = 2 }, []string{kindDense, kindDense, kindMoE}},
		"no dense":     {func(m map[string]any) { m["first_k_dense_replace"] = 0 }, []string{kindMoE, kindMoE, kindMoE}},
		"partial gone": {func(m map[string]any) { delete(m["rope_parameters"].(map[string]any), "partial_rotary_factor") }, []string{kindDense, kindMoE, kindMoE}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := tinyModel(t, tc.edit)
			plan, got := plugintest.Kinds(t, plugin, m, nil)
			if !slices.Equal(got, tc.want) {
				t.Errorf("kinds %v, want %v", got, tc.want)
			}
			if plan.GetMtp() != nil || len(plan.GetExtraOutputs()) != 0 {
				t.Errorf("no MTP weights, yet mtp %v, extra outputs %v", plan.GetMtp(), plan.GetExtraOutputs())
			}
		})
	}
	// the rotary dimension: half of head_dim whether the factor is written or not
	for _, edit := range []func(map[string]any){nil, func(m map[string]any) {
		delete(m["rope_parameters"].(map[string]any), "partial_rotary_factor")
	}} {
		resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: tinyModel(t, edit), Part: sdk.PartContext})
		if err != nil {
			t.Fatal(err)
		}
		var freqs []int
		for _, n := range resp.GetFunction().GetNode() {
			for _, a := range n.GetAttribute() {
				size := len(a.GetT().GetFloatData())
				if a.GetT().GetDataType() == 1 && size == 0 {
					size = len(a.GetT().GetRawData()) / 4
				}
				if n.GetOpType() == "Constant" && size > 1 {
					freqs = append(freqs, size)
				}
			}
		}
		if !slices.Equal(freqs, []int{4}) {
			t.Errorf("inv_freq constants of sizes %v, want one of 4 (rotary dimension 8 = head_dim 16 × 0.5)", freqs)
		}
	}
}

func TestMTPDetection(t *testing.T) {
	cases := map[string]struct {
		model   func(t *testing.T) *pb.Model
		opts    map[string]string
		ok      bool
		reason  string // in Check's reasons (a note) or the error
		layout  string
		nLayers int
	}{
		"declared, absent, skip": {func(t *testing.T) *pb.Model { return tinyModel(t, nil) }, nil, true,
			"declares 1 MTP layer(s) (num_nextn_predict_layers), but the checkpoint holds none of model.layers.3.*", "", 0},
		"declared, absent, draft": {func(t *testing.T) *pb.Model { return tinyModel(t, nil) }, map[string]string{decoder.MTPOptionName: decoder.MTPDraft}, false,
			"--mtp draft: config.json declares 1 MTP layer(s) (num_nextn_predict_layers) at model.layers.3.*, but the checkpoint holds none", "", 0},
		"null count": {func(t *testing.T) *pb.Model {
			return tinyModel(t, func(m map[string]any) { m["num_nextn_predict_layers"] = nil })
		}, nil, true, "", "", 0},
		"inlined, skip": {func(t *testing.T) *pb.Model { return withMTP(t, false, nil) }, nil, true,
			"MTP layer(s) 3 (inlined, ", decoder.MTPInlined, 1},
		"inlined, draft": {func(t *testing.T) *pb.Model { return withMTP(t, false, nil) }, map[string]string{decoder.MTPOptionName: decoder.MTPDraft}, true, "", decoder.MTPInlined, 1},
		"present, undeclared": {func(t *testing.T) *pb.Model {
			return withMTP(t, false, func(m map[string]any) { m["num_nextn_predict_layers"] = 0 })
		}, nil, true, "holds model.layers.3.*, which config.json declares neither as decoder nor as MTP layers", "", 0},
		"present, undeclared, draft": {func(t *testing.T) *pb.Model {
			return withMTP(t, false, func(m map[string]any) { m["num_nextn_predict_layers"] = 0 })
		}, map[string]string{decoder.MTPOptionName: decoder.MTPDraft}, false, "cannot tell which layer the draft is", "", 0},
		"two declared, one present": {func(t *testing.T) *pb.Model {
			return withMTP(t, false, func(m map[string]any) { m["num_nextn_predict_layers"] = 2 })
		}, nil, false, "holds model.layers.3.* and not model.layers.4.*", "", 0},
		// A count in config.json bounds no work (issue 30: 1e9 ran past 40 s).
		"a billion declared, one present": {func(t *testing.T) *pb.Model {
			return withMTP(t, false, func(m map[string]any) { m["num_nextn_predict_layers"] = 1e9 })
		}, nil, false, "holds model.layers.3.* and not 999999999 of the layers model.layers.3.* to model.layers.1000000002.*", "", 0},
		"a billion declared, none present": {func(t *testing.T) *pb.Model {
			return tinyModel(t, func(m map[string]any) { m["num_nextn_predict_layers"] = 1e9 })
		}, nil, true, "declares 1000000000 MTP layer(s) (num_nextn_predict_layers), but the checkpoint holds none of 1000000000 of the layers", "", 0},
		"draft, part missing": {func(t *testing.T) *pb.Model {
			m := withMTP(t, false, nil)
			m.Tensors = slices.DeleteFunc(m.Tensors, func(ti *pb.TensorInfo) bool { return ti.Key == layerKey(3, "eh_proj.weight") })
			return m
		}, map[string]string{decoder.MTPOptionName: decoder.MTPDraft}, false, "model.layers.3.eh_proj.weight", "", 0},
		"indexed mtp keys": {func(t *testing.T) *pb.Model {
			m := tinyModel(t, nil)
			m.Tensors = append(m.Tensors, &pb.TensorInfo{Key: "mtp.fc.weight", Dtype: "BF16", Shape: []int64{64, 128}})
			return m
		}, nil, true, "(indexed, 1 tensors)", decoder.MTPIndexed, 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := tc.model(t)
			ok, reasons := check(t, m, tc.opts)
			if ok != tc.ok || !strings.Contains(reasons, tc.reason) {
				t.Fatalf("supported=%v reasons=%q, want supported=%v with %q", ok, reasons, tc.ok, tc.reason)
			}
			if !ok {
				return
			}
			plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: m, Options: &pb.ExportOptions{PluginOptions: tc.opts}})
			if err != nil {
				t.Fatal(err)
			}
			if got := plan.GetMtp().GetConvention(); got != tc.layout || len(plan.GetMtp().GetLayers()) != tc.nLayers {
				t.Errorf("mtp %v, want convention %q with %d layers", plan.GetMtp(), tc.layout, tc.nLayers)
			}
			if len(plan.GetLayers()) != 3 {
				t.Errorf("%d decoder layers, want 3", len(plan.GetLayers()))
			}
			hidden := len(plan.GetExtraOutputs()) == 1 && plan.GetExtraOutputs()[0].GetName() == sdk.HiddenStates
			if hidden != (tc.opts[decoder.MTPOptionName] == decoder.MTPDraft) {
				t.Errorf("extra outputs %v with options %v", plan.GetExtraOutputs(), tc.opts)
			}
			if tc.layout == decoder.MTPInlined {
				keys := plan.GetMtp().GetKeys()
				if !slices.Contains(keys, layerKey(3, "eh_proj.weight")) || !slices.Contains(keys, layerKey(3, decoder.ExpertName(11, "down_proj"))) ||
					slices.ContainsFunc(keys, func(k string) bool { return !strings.HasPrefix(k, "model.layers.3.") }) {
					t.Errorf("MTP keys %d, want every model.layers.3.* key", len(keys))
				}
			}
		})
	}
}

// Every formal input of every part, the draft included, is a host role or
// bound to tensors present; the draft reads the MTP layer's tensors and
// its own embedding and head when present, else the main model's.
func TestBuildBindsEveryWeight(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprint("own head ", own), func(t *testing.T) {
			m := withMTP(t, own, nil)
			opts := &pb.ExportOptions{PluginOptions: map[string]string{decoder.MTPOptionName: decoder.MTPDraft}}
			parts := plugintest.RequireBound(t, plugin, m,
				&pb.BuildRequest{Part: sdk.PartEmbed, Options: opts}, &pb.BuildRequest{Part: sdk.PartContext, Options: opts},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindDense, Layers: []int32{0}, Options: opts},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindMoE, Layers: []int32{1, 2}, Options: opts},
				&pb.BuildRequest{Part: sdk.PartFinal, Options: opts})
			if got := parts[3][2]["mlp.shared_experts.up_proj.weight"]; !slices.Equal(got, []string{layerKey(2, "mlp.shared_experts.up_proj.weight")}) {
				t.Errorf("shared experts read %v", got)
			}
			bound := plugintest.DraftBound(t, plugin, m, opts, decoder.ModelMTP, sdk.InputIDs, sdk.PositionIDs, sdk.HiddenStates, "past_key.3", "past_value.3")
			wantHead, wantEmbed := "lm_head.weight", "model.embed_tokens.weight"
			if own {
				wantHead, wantEmbed = layerKey(3, "shared_head.head.weight"), layerKey(3, "embed_tokens.weight")
			}
			if !slices.Equal(bound["shared_head.head.weight"], []string{wantHead}) || !slices.Equal(bound["embed_tokens.weight"], []string{wantEmbed}) {
				t.Errorf("head %v, embedding %v; want %s, %s", bound["shared_head.head.weight"], bound["embed_tokens.weight"], wantHead, wantEmbed)
			}
			if got := bound["mlp.experts.down"]; len(got) != 12 || got[11] != layerKey(3, decoder.ExpertName(11, "down_proj")) {
				t.Errorf("draft experts read %v", got)
			}
		})
	}
}

func TestDraftNeedsTheOption(t *testing.T) {
	_, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: withMTP(t, false, nil), Part: sdk.PartModel, ModelName: decoder.ModelMTP})
	if err == nil || !strings.Contains(err.Error(), "needs --mtp draft") {
		t.Errorf("error %v, want one naming --mtp draft", err)
	}
}

func layerKey(l int32, name string) string { return fmt.Sprintf("model.layers.%d.%s", l, name) }
