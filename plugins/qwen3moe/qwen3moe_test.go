package qwen3moe

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// tinyConfig is shaped like transformers 5's save of a Qwen3MoeConfig
// (num_local_experts, not num_experts).
const tinyConfig = `{"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96,
	"moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
	"head_dim": 16, "vocab_size": 128, "rms_norm_eps": 1e-6, "num_local_experts": 12, "num_experts_per_tok": 4,
	"norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [0]}`

// tinyModel is a config, edited by edit, with the tensors it implies in the
// given expert layout.
func tinyModel(t *testing.T, layout decoder.ExpertLayout, edit func(map[string]any)) *pb.Model {
	t.Helper()
	var seeds []*pb.TensorInfo // what tells the layouts apart
	for l := range 4 {
		key := func(name string) string { return fmt.Sprintf("model.layers.%d.%s", l, name) }
		if layout == decoder.PerExpert {
			seeds = append(seeds, &pb.TensorInfo{Key: key(decoder.ExpertName(0, "gate_proj"))}, &pb.TensorInfo{Key: key(decoder.ExpertName(11, "gate_proj"))})
		} else {
			seeds = append(seeds, &pb.TensorInfo{Key: key("mlp.experts.gate_up_proj"), Shape: []int64{12, 64, 64}})
		}
	}
	return plugintest.Edited(t, plugin, tinyConfig, edit, "BF16", seeds...)
}

func TestConfigErrors(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"no expert count": {func(m map[string]any) { delete(m, "num_local_experts") }, `"num_experts"`},
		"no moe size":     {func(m map[string]any) { delete(m, "moe_intermediate_size") }, `"moe_intermediate_size" is missing`},
		"top-k too big":   {func(m map[string]any) { m["num_experts_per_tok"] = 13 }, "num_experts_per_tok 13 must be in 1..num_experts (12)"},
		"zero top-k":      {func(m map[string]any) { m["num_experts_per_tok"] = 0 }, "must be in 1..num_experts"},
		"sparse step 0":   {func(m map[string]any) { m["decoder_sparse_step"] = 0 }, "decoder_sparse_step must be at least 1"},
		"sliding window":  {func(m map[string]any) { m["use_sliding_window"] = true }, "full attention only"},
		"gelu":            {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu"`},
		"bad mlp_only":    {func(m map[string]any) { m["mlp_only_layers"] = "0" }, `"mlp_only_layers"`},
		"kv heads":        {func(m map[string]any) { m["num_key_value_heads"] = 3 }, "multiple of num_key_value_heads (3)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			resp, err := plugin.Check(context.Background(), &pb.CheckRequest{Model: tinyModel(t, decoder.PerExpert, tc.edit)})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetSupported() || !strings.Contains(strings.Join(resp.GetReasons(), ";"), tc.want) {
				t.Errorf("supported=%v reasons=%v, want unsupported because %q", resp.GetSupported(), resp.GetReasons(), tc.want)
			}
		})
	}
}

func TestExpertLayouts(t *testing.T) {
	cases := map[string]struct {
		model func(t *testing.T) *pb.Model
		want  string // error, or "" for supported
	}{
		"per-expert": {func(t *testing.T) *pb.Model { return tinyModel(t, decoder.PerExpert, nil) }, ""},
		"fused":      {func(t *testing.T) *pb.Model { return tinyModel(t, decoder.FusedRows, nil) }, ""},
		"experts missing": {func(t *testing.T) *pb.Model {
			m := tinyModel(t, decoder.PerExpert, nil)
			m.Tensors = slices.DeleteFunc(m.Tensors, func(ti *pb.TensorInfo) bool { return strings.Contains(ti.Key, "layers.3.mlp.experts") })
			return m
		}, "layer 3 is a MoE layer but holds neither per-expert tensors"},
		"one expert missing": {func(t *testing.T) *pb.Model {
			m := tinyModel(t, decoder.PerExpert, nil)
			m.Tensors = slices.DeleteFunc(m.Tensors, func(ti *pb.TensorInfo) bool { return ti.Key == layerKey(1, decoder.ExpertName(11, "down_proj")) })
			return m
		}, "model.layers.1.mlp.experts.11.down_proj.weight"},
		"expert count the tensors cannot back": {func(t *testing.T) *pb.Model {
			m := tinyModel(t, decoder.PerExpert, nil)
			m.ConfigJson = plugintest.Config(t, tinyConfig, func(c map[string]any) { c["num_local_experts"] = 1_000_000_000 })
			return m
		}, "num_experts is 1000000000, but layer 1 has no tensor model.layers.1.mlp.experts.999999999.gate_proj.weight"},
		"fused misshapen": {func(t *testing.T) *pb.Model {
			m := tinyModel(t, decoder.FusedRows, nil)
			for _, ti := range m.Tensors {
				if ti.Key == layerKey(1, "mlp.experts.gate_up_proj") {
					ti.Shape = []int64{12, 32, 64} // gate only
				}
			}
			return m
		}, "has shape [12 32 64]; config.json implies [12 64 64]"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			resp, err := plugin.Check(context.Background(), &pb.CheckRequest{Model: tc.model(t)})
			if err != nil {
				t.Fatal(err)
			}
			reasons := strings.Join(resp.GetReasons(), ";")
			if tc.want == "" && !resp.GetSupported() {
				t.Fatalf("unsupported: %s", reasons)
			}
			if tc.want != "" && (resp.GetSupported() || !strings.Contains(reasons, tc.want)) {
				t.Errorf("supported=%v reasons=%q, want %q", resp.GetSupported(), reasons, tc.want)
			}
		})
	}
}

// Layer kinds follow transformers' rule: sparse unless listed in
// mlp_only_layers or (i+1) is not a multiple of decoder_sparse_step.
func TestPlanLayerKinds(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want []string
	}{
		"step 2, layer 0 dense": {nil, []string{kindDense, kindMoE, kindDense, kindMoE}},
		"all sparse": {func(m map[string]any) { m["decoder_sparse_step"] = 1; m["mlp_only_layers"] = []int{} },
			[]string{kindMoE, kindMoE, kindMoE, kindMoE}},
		"no experts": {func(m map[string]any) { m["num_local_experts"] = 0; m["num_experts_per_tok"] = 0 },
			[]string{kindDense, kindDense, kindDense, kindDense}},
		"listed dense": {func(m map[string]any) { m["decoder_sparse_step"] = 1; m["mlp_only_layers"] = []int{1, 2} },
			[]string{kindMoE, kindDense, kindDense, kindMoE}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			plan, got := plugintest.Kinds(t, plugin, tinyModel(t, decoder.PerExpert, tc.edit), nil)
			if !slices.Equal(got, tc.want) {
				t.Errorf("kinds %v, want %v", got, tc.want)
			}
			shape := plan.GetKinds()[0].GetCaches()[0].GetShape()
			if shape[1].GetSize() != 2 || shape[3].GetSize() != 16 {
				t.Errorf("cache shape %v, want [batch_size, 2, ctx_len, 16]", shape)
			}
		})
	}
}

func TestPluginOptions(t *testing.T) {
	cases := map[string]struct {
		opts map[string]string
		want string
	}{
		"default":        {nil, ""},
		"dense":          {map[string]string{decoder.MoEStrategy: blocks.Dense}, ""},
		"bad strategy":   {map[string]string{decoder.MoEStrategy: "sparse"}, `moe_strategy "sparse": use gather or dense`},
		"unknown option": {map[string]string{"experts_per_tok": "2"}, `no option "experts_per_tok" (it has: moe_strategy)`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: tinyModel(t, decoder.PerExpert, nil),
				Options: &pb.ExportOptions{PluginOptions: tc.opts}})
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// Every formal input of every part is a role the host binds or a weight
// bound to tensors the checkpoint holds, in both layouts; the experts are
// stacked in numeric order (expert 10 after 9, not after 1).
func TestBuildBindsEveryWeight(t *testing.T) {
	for _, layout := range []decoder.ExpertLayout{decoder.PerExpert, decoder.FusedRows} {
		t.Run(fmt.Sprint("layout ", layout), func(t *testing.T) {
			parts := plugintest.RequireBound(t, plugin, tinyModel(t, layout, nil),
				&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindDense, Layers: []int32{0, 2}},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindMoE, Layers: []int32{1, 3}},
				&pb.BuildRequest{Part: sdk.PartFinal})
			down := parts[3][3]["mlp.experts.down"]
			want := []string{layerKey(3, "mlp.experts.down_proj")}
			if layout == decoder.PerExpert {
				want = nil
				for e := range 12 {
					want = append(want, layerKey(3, decoder.ExpertName(e, "down_proj")))
				}
			}
			if !slices.Equal(down, want) {
				t.Errorf("layer 3 mlp.experts.down reads %v, want %v", down, want)
			}
		})
	}
}

func TestBuildRefusesWrongKind(t *testing.T) {
	cases := map[string]struct {
		kind   string
		layers []int32
		want   string
	}{
		"dense layer as moe": {kindMoE, []int32{0}, "layer 0 is not of kind moe"},
		"moe layer as dense": {kindDense, []int32{3}, "layer 3 is not of kind dense"},
		"unknown kind":       {"shared", []int32{1}, `asked for "shared"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: tinyModel(t, decoder.PerExpert, nil),
				Part: sdk.PartLayer, Kind: tc.kind, Layers: tc.layers})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func layerKey(l int32, name string) string { return fmt.Sprintf("model.layers.%d.%s", l, name) }
