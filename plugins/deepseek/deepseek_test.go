package deepseek

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// tinyConfig is shaped like transformers 5's save of a DeepseekV3Config.
const tinyConfig = `{"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 96,
	"moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
	"vocab_size": 128, "rms_norm_eps": 1e-5, "n_routed_experts": 8, "num_experts_per_tok": 3,
	"n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "norm_topk_prob": true,
	"routed_scaling_factor": 2.5, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 12,
	"qk_rope_head_dim": 8, "v_head_dim": 10, "rope_interleave": true, "attention_bias": true,
	"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}`

func layerKey(i int32, name string) string { return fmt.Sprintf("model.layers.%d.%s", i, name) }

func tinyModel(t *testing.T, edit func(map[string]any)) *pb.Model {
	t.Helper()
	var seeds []*pb.TensorInfo
	for l := int32(0); l < 3; l++ {
		seeds = append(seeds, &pb.TensorInfo{Key: layerKey(l, decoder.ExpertName(0, "gate_proj"))},
			&pb.TensorInfo{Key: layerKey(l, decoder.ExpertName(7, "gate_proj"))})
	}
	return plugintest.Edited(t, plugin, tinyConfig, edit, "BF16", seeds...)
}

func TestConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"no latent":      {func(m map[string]any) { m["kv_lora_rank"] = 0 }, "kv_lora_rank must be positive"},
		"q lora 0":       {func(m map[string]any) { m["q_lora_rank"] = 0 }, "q_lora_rank must be positive, or null"},
		"partial rotary": {func(m map[string]any) { m["rope_parameters"].(map[string]any)["partial_rotary_factor"] = 0.5 }, "rotates all of them"},
		"groups":         {func(m map[string]any) { m["n_group"] = 3 }, "n_group 3 must divide n_routed_experts (8)"},
		"activation":     {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu" is not supported by the deepseek plugin`},
		"scoring":        {func(m map[string]any) { m["scoring_func"] = "softmax" }, `scoring_func "softmax"`},
		"topk method":    {func(m map[string]any) { m["topk_method"] = "greedy" }, `topk_method "greedy"`},
		"layer freq":     {func(m map[string]any) { m["moe_layer_freq"] = 2 }, "moe_layer_freq 2"},
		"negative dense": {func(m map[string]any) { m["first_k_dense_replace"] = -1 }, "first_k_dense_replace must be ≥ 0"},
		"lite layer type": {func(m map[string]any) {
			m["model_type"] = "glm4_moe_lite"
			m["mlp_layer_types"] = []any{"dense", "moe", "sparse"}
		}, `mlp_layer_types[1] is "moe"`},
		"lite layer count": {func(m map[string]any) { m["model_type"] = "glm4_moe_lite"; m["mlp_layer_types"] = []any{"dense"} },
			"mlp_layer_types lists 1 layers, num_hidden_layers is 3"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := plugin.LoadConfig(plugintest.Config(t, tinyConfig, tc.edit))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPlanKindsAndCaches(t *testing.T) {
	for name, tc := range map[string]struct {
		edit  func(map[string]any)
		cb    bool
		kinds []string
	}{
		"deepseek_v3":   {nil, false, []string{kindDense, kindMoE, kindMoE}},
		"kimi_k2":       {func(m map[string]any) { m["model_type"] = "kimi_k2" }, false, []string{kindDense, kindMoE, kindMoE}},
		"dense two, CB": {func(m map[string]any) { m["first_k_dense_replace"] = 2 }, true, []string{kindDense, kindDense, kindMoE}},
		"glm4_moe_lite default layer types": {func(m map[string]any) { m["model_type"] = "glm4_moe_lite"; delete(m, "first_k_dense_replace") },
			false, []string{kindDense, kindMoE, kindMoE}},
		"glm4_moe_lite layer types": {func(m map[string]any) {
			m["model_type"] = "glm4_moe_lite"
			m["mlp_layer_types"] = []any{"sparse", "dense", "sparse"}
		}, false, []string{kindMoE, kindDense, kindMoE}},
	} {
		t.Run(name, func(t *testing.T) {
			opts := &pb.ExportOptions{ContinuousBatching: tc.cb}
			plan, kinds := plugintest.Kinds(t, plugin, tinyModel(t, tc.edit), opts)
			if !slices.Equal(kinds, tc.kinds) {
				t.Errorf("kinds %v, want %v", kinds, tc.kinds)
			}
			rows := "batch_size"
			if tc.cb {
				rows = "full_batch_size"
			}
			want := []string{"compressed_kv [" + rows + " ctx_len 16]", "k_pe [" + rows + " 1 ctx_len 8]"}
			for _, k := range plan.GetKinds() {
				var got []string
				for _, c := range k.GetCaches() {
					var dims []string
					for _, d := range c.GetShape() {
						dims = append(dims, d.GetParam())
						if d.GetParam() == "" {
							dims[len(dims)-1] = fmt.Sprint(d.GetSize())
						}
					}
					got = append(got, c.GetName()+" ["+strings.Join(dims, " ")+"]")
				}
				if !slices.Equal(got, want) {
					t.Errorf("kind %s caches %v, want %v", k.GetName(), got, want)
				}
			}
		})
	}
}

// TestSoftmaxScale: qk_head_dim^-0.5, times yarn_get_mscale(factor,
// mscale_all_dim)² when the rope type is not default and mscale_all_dim is
// set, as transformers' yarn_apply_mscale.
func TestSoftmaxScale(t *testing.T) {
	base := math.Pow(20, -0.5)
	for name, tc := range map[string]struct {
		rope map[string]any
		want float64
	}{
		"default": {map[string]any{"rope_theta": 10000.0, "rope_type": "default"}, base},
		"yarn mscale_all_dim": {map[string]any{"rope_theta": 10000.0, "rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
			"original_max_position_embeddings": 4096}, base * math.Pow(0.1*math.Log(40)+1, 2)},
		"yarn without mscale_all_dim": {map[string]any{"rope_theta": 10000.0, "rope_type": "yarn", "factor": 40.0,
			"original_max_position_embeddings": 4096}, base},
		"legacy rope_scaling": {nil, base * math.Pow(0.1*0.707*math.Log(4)+1, 2)},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := plugin.LoadConfig(plugintest.Config(t, tinyConfig, func(c map[string]any) {
				c["first_k_dense_replace"] = 3 // no MoE layer: LoadConfig has no expert tensors to detect
				if tc.rope == nil {
					delete(c, "rope_parameters")
					c["rope_theta"] = 10000.0
					c["rope_scaling"] = map[string]any{"type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0.707,
						"original_max_position_embeddings": 16}
					return
				}
				c["rope_parameters"] = tc.rope
			}))
			if err != nil {
				t.Fatal(err)
			}
			a := &decoder.MLA{QLoRARank: 24, NopeDim: 12, RopeDim: 8, Rank: 16, VDim: 10}
			if err := checkMLA(m, a); err != nil {
				t.Fatal(err)
			}
			if math.Abs(a.Scaling-tc.want) > 1e-12 || m.RoPE.Dim != 8 {
				t.Errorf("scaling %v, rope dim %d; want %v, 8", a.Scaling, m.RoPE.Dim, tc.want)
			}
		})
	}
}

// TestDefaults: DeepseekV3Config's values for what config.json omits; a
// null q_lora_rank is q_proj.
func TestDefaults(t *testing.T) {
	m, err := plugin.LoadConfig(plugintest.Config(t, tinyConfig, func(c map[string]any) {
		for _, k := range []string{"q_lora_rank", "n_group", "topk_group", "first_k_dense_replace", "rope_interleave"} {
			delete(c, k)
		}
		c["n_routed_experts"] = 16
	}))
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]int{"q_lora_rank": 1536, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3} {
		if got := m.Int(k); got != want || !m.Defaulted(k) {
			t.Errorf("%s: %d (defaulted %v), want the default %d", k, got, m.Defaulted(k), want)
		}
	}
	noLoRA := tinyModel(t, func(c map[string]any) { c["q_lora_rank"] = nil })
	parts := plugintest.RequireBound(t, plugin, noLoRA, &pb.BuildRequest{Part: sdk.PartLayer, Kind: kindMoE, Layers: []int32{1, 2}})
	if _, ok := parts[0][1]["self_attn.q_proj.weight"]; !ok {
		t.Errorf("q_lora_rank null binds %v, want self_attn.q_proj.weight", parts[0][1])
	}
}

// TestBuildBindsEveryWeight: every part, both forms, every serving mode.
func TestBuildBindsEveryWeight(t *testing.T) {
	for _, form := range []string{blocks.MLAAbsorbed, blocks.MLAExpanded} {
		t.Run(form, func(t *testing.T) {
			opts := &pb.ExportOptions{PluginOptions: map[string]string{optForm: form}}
			parts := plugintest.RequireBound(t, plugin, tinyModel(t, nil),
				&pb.BuildRequest{Part: sdk.PartEmbed, Options: opts}, &pb.BuildRequest{Part: sdk.PartContext, Options: opts},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindDense, Layers: []int32{0}, Options: opts},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: kindMoE, Layers: []int32{1, 2}, Options: opts},
				&pb.BuildRequest{Part: sdk.PartFinal, Options: opts})
			for _, w := range []string{"self_attn.q_a_proj.bias", "self_attn.q_a_layernorm.weight", "self_attn.kv_a_proj_with_mqa.bias",
				"self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight", "self_attn.o_proj.bias", "mlp.gate.e_score_correction_bias"} {
				if got := parts[3][2][w]; !slices.Equal(got, []string{layerKey(2, w)}) {
					t.Errorf("%s reads %v", w, got)
				}
			}
		})
	}
}

// kimiInvFreq is transformers 5.24's yarn inv_freq for Kimi-K2's rope
// (rope_theta 5e4, factor 32, beta_fast = beta_slow = 1, original 4096,
// 64 rotary dims): ROPE_INIT_FUNCTIONS["yarn"], printed as float32.
var kimiInvFreq = []float32{1.0, 0.7131111025810242, 0.5085274577140808, 0.362636536359787, 0.2586001455783844,
	0.18441061675548553, 0.13150526583194733, 0.0937778577208519, 0.06687403470277786, 0.04768861457705498,
	0.034007277339696884, 0.024250967428088188, 0.01729363389313221, 0.012332281097769737, 0.008794286288321018,
	0.006271303631365299, 0.004472136031836271, 0.0031891297549009323, 0.0022742038127034903, 0.0016217599622905254,
	3.614046727307141e-05, 2.577216764620971e-05, 1.8378419554210268e-05, 1.3105854122841265e-05, 9.345930266135838e-06,
	6.664686225121841e-06, 4.752661425300175e-06, 3.389175617485307e-06, 2.416858706055791e-06, 1.723488821880892e-06,
	1.229038957717421e-06, 8.764412768869079e-07}

// TestKimiRoPE: Kimi-K2's equal betas (a zero-width ramp transformers
// widens by 0.001) give transformers' frequencies; attention factor 1.
func TestKimiRoPE(t *testing.T) {
	m, err := plugin.LoadConfig(plugintest.Config(t, tinyConfig, func(c map[string]any) {
		c["model_type"], c["first_k_dense_replace"], c["qk_rope_head_dim"] = "kimi_k2", 3, 64
		c["max_position_embeddings"] = 131072
		delete(c, "rope_parameters")
		c["rope_theta"] = 50000.0
		c["rope_scaling"] = map[string]any{"type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0,
			"mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}
	}))
	if err != nil {
		t.Fatal(err)
	}
	got := m.RoPE.InvFreq()
	if len(got) != len(kimiInvFreq) || m.RoPE.AttentionScaling != 1 {
		t.Fatalf("%d frequencies, attention %v; want %d, 1", len(got), m.RoPE.AttentionScaling, len(kimiInvFreq))
	}
	for i, want := range kimiInvFreq {
		if math.Abs(float64(got[i]-want)) > 1e-6*float64(want) {
			t.Errorf("inv_freq[%d] = %g, transformers %g", i, got[i], want)
		}
	}
}
