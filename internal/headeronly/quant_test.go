//go:build unix

package headeronly

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/quant"
)

// TestFineGrainedFP8 writes a tiny quant_method "fp8" Qwen3-MoE (a dense
// layer 0, a MoE layer 1, widths no multiple of the 128 block) and checks
// every key, dtype and shape: Linear weights F8_E4M3, each followed by its
// F32 weight_scale_inv of ceil(out/128) × ceil(in/128); norms, the router,
// embedding and head BF16; modules_to_not_convert honoured at dots (the
// router pattern model.layers.0.mlp.gate leaves mlp.gate_proj quantised).
// Then strata's quantisation reader resolves all 16 weights, each beside
// its scale in one shard.
func TestFineGrainedFP8(t *testing.T) {
	config := []byte(`{"model_type": "qwen3_moe", "hidden_size": 200, "intermediate_size": 300,
		"moe_intermediate_size": 130, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
		"head_dim": 72, "vocab_size": 50, "num_experts": 2, "mlp_only_layers": [0],
		"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
			"weight_block_size": [128, 128],
			"modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate", "mlp.gate", "model.layers.1.self_attn.o_proj"]}}`)
	tensors, err := Tensors(config, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	bf16 := func(name string, shape ...int64) []string { return []string{fmt.Sprintf("%s BF16 %v", name, shape)} }
	fp8 := func(name string, out, in, rows, cols int64) []string {
		return []string{fmt.Sprintf("%s.weight F8_E4M3 [%d %d]", name, out, in),
			fmt.Sprintf("%s.weight_scale_inv F32 [%d %d]", name, rows, cols)}
	}
	var want []string
	add := func(lines ...[]string) {
		for _, l := range lines {
			want = append(want, l...)
		}
	}
	add(bf16("model.embed_tokens.weight", 50, 200))
	for l := range 2 {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(fp8(p+"self_attn.q_proj", 144, 200, 2, 2), fp8(p+"self_attn.k_proj", 72, 200, 1, 2),
			fp8(p+"self_attn.v_proj", 72, 200, 1, 2))
		if l == 0 {
			add(fp8(p+"self_attn.o_proj", 200, 144, 2, 2))
		} else {
			add(bf16(p+"self_attn.o_proj.weight", 200, 144)) // in modules_to_not_convert
		}
		add(bf16(p+"self_attn.q_norm.weight", 72), bf16(p+"self_attn.k_norm.weight", 72))
		if l == 0 {
			add(fp8(p+"mlp.gate_proj", 300, 200, 3, 2), fp8(p+"mlp.up_proj", 300, 200, 3, 2), fp8(p+"mlp.down_proj", 200, 300, 2, 3))
		} else {
			add(bf16(p+"mlp.gate.weight", 2, 200))
			for e := range 2 {
				ep := fmt.Sprintf("%smlp.experts.%d.", p, e)
				add(fp8(ep+"gate_proj", 130, 200, 2, 2), fp8(ep+"up_proj", 130, 200, 2, 2), fp8(ep+"down_proj", 200, 130, 2, 2))
			}
		}
		add(bf16(p+"input_layernorm.weight", 200), bf16(p+"post_attention_layernorm.weight", 200))
	}
	add(bf16("model.norm.weight", 200), bf16("lm_head.weight", 50, 200))
	got := make([]string, len(tensors))
	for i, x := range tensors {
		got[i] = fmt.Sprintf("%s %s %v", x.Name, x.DType, x.Shape)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tensors:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	dir := t.TempDir()
	st, err := Write(dir, config, tensors, 100_000) // ~100 kB shards: pairs straddle shard limits
	if err != nil {
		t.Fatal(err)
	}
	c, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Shards < 4 {
		t.Fatalf("%d shards; the test wants several", st.Shards)
	}
	checkContiguous(t, c)
	checkScalesBeside(t, c, "_scale_inv")
	v, err := quant.Read(c)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(v.Weights()); n != 16 { // layer 0: 7; layer 1: q, k, v and 2 × 3 expert projections
		t.Errorf("strata reads %d quantised weights, want 16", n)
	}
}

// checkScalesBeside checks every scale (a key ending in suffix) is in its
// weight's shard, and every F8_E4M3 weight has one.
func checkScalesBeside(t *testing.T, c *checkpoint.Checkpoint, suffix string) {
	t.Helper()
	for _, k := range c.Keys() {
		x, _ := c.Tensor(k)
		if w, ok := strings.CutSuffix(k, suffix); ok {
			if wt, ok := c.Tensor(w); !ok || wt.Shard != x.Shard {
				t.Errorf("%s is in %s, its weight %s in %q", k, x.Shard, w, wt.Shard)
			}
		} else if x.DType == "F8_E4M3" {
			if _, ok := c.Tensor(k + suffix); !ok {
				t.Errorf("%s has no %s", k, k+suffix)
			}
		}
	}
}

// TestCompressedTensorsFP8 writes a tiny glm4_moe (a dense layer, a MoE
// layer with a shared expert, the MTP layer) as compressed-tensors
// float-quantized 8-bit weights, and checks the scale per strategy: an
// F8_E4M3 weight and a weight_scale in the checkpoint dtype; ignore by name
// and by "re:" pattern; routers, the correction bias, norms and eh_proj
// unquantised.
func TestCompressedTensorsFP8(t *testing.T) {
	const model = `"model_type": "glm4_moe", "hidden_size": 160, "intermediate_size": 200, "moe_intermediate_size": 96,
		"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 40,
		"n_routed_experts": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "num_nextn_predict_layers": 1,
		"attention_bias": true, "use_qk_norm": true`
	group := func(strategy, block string) string {
		return fmt.Sprintf(`{"config_groups": {"group_0": {"targets": ["Linear"],
			"input_activations": {"dynamic": true, "num_bits": 8, "strategy": "token", "type": "float"},
			"weights": {"num_bits": 8, "type": "float", "strategy": %q, "block_structure": %s, "dynamic": false}}},
			"format": "float-quantized", "ignore": ["lm_head", "re:.*self_attn\\.o_proj$"], "quant_method": "compressed-tensors"}`, strategy, block)
	}
	// q_proj [128, 160], down_proj of the dense layer [160, 200].
	cases := map[string]struct {
		group     string
		q, down   []int64
		scaleType string
	}{
		"channel":       {group("channel", "null"), []int64{128, 1}, []int64{160, 1}, "BF16"},
		"tensor":        {group("tensor", "null"), []int64{1}, []int64{1}, "BF16"},
		"block 128×128": {group("block", "[128, 128]"), []int64{1, 2}, []int64{2, 2}, "BF16"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			config := []byte(`{` + model + `, "quantization_config": ` + tc.group + `}`)
			tensors, err := Tensors(config, "BF16")
			if err != nil {
				t.Fatal(err)
			}
			has := map[string]Tensor{}
			for _, x := range tensors {
				has[x.Name] = x
			}
			for key, want := range map[string]string{
				"model.layers.0.self_attn.q_proj.weight":                   "F8_E4M3 [128 160]",
				"model.layers.0.self_attn.q_proj.weight_scale":             fmt.Sprintf("%s %v", tc.scaleType, tc.q),
				"model.layers.0.mlp.down_proj.weight_scale":                fmt.Sprintf("%s %v", tc.scaleType, tc.down),
				"model.layers.0.self_attn.q_proj.bias":                     "BF16 [128]",
				"model.layers.0.self_attn.o_proj.weight":                   "BF16 [160 128]", // ignored by pattern
				"model.layers.1.mlp.experts.1.down_proj.weight":            "F8_E4M3 [160 96]",
				"model.layers.1.mlp.shared_experts.up_proj.weight":         "F8_E4M3 [96 160]",
				"model.layers.1.mlp.gate.weight":                           "BF16 [2 160]",
				"model.layers.1.mlp.gate.e_score_correction_bias":          "F32 [2]",
				"model.layers.2.mlp.experts.0.gate_proj.weight":            "F8_E4M3 [96 160]", // MTP layer
				"model.layers.2.eh_proj.weight":                            "BF16 [160 320]",
				"model.layers.1.self_attn.k_norm.weight":                   "BF16 [64]",
				"lm_head.weight":                                           "BF16 [40 160]",
				"model.embed_tokens.weight":                                "BF16 [40 160]",
				"model.layers.1.mlp.shared_experts.down_proj.weight_scale": tc.scaleType,
			} {
				x, ok := has[key]
				if got := fmt.Sprintf("%s %v", x.DType, x.Shape); !ok || !strings.HasPrefix(got, want) {
					t.Errorf("%s = %q (present %v), want %q", key, got, ok, want)
				}
			}
			for _, absent := range []string{"lm_head.weight_scale", "model.layers.0.self_attn.o_proj.weight_scale",
				"model.layers.1.mlp.gate.weight_scale", "model.layers.0.self_attn.q_proj.weight_scale_inv"} {
				if _, ok := has[absent]; ok {
					t.Errorf("unexpected %s", absent)
				}
			}
			dir := t.TempDir()
			if _, err := Write(dir, config, tensors, 50_000); err != nil {
				t.Fatal(err)
			}
			c, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			checkScalesBeside(t, c, "_scale")
		})
	}
}

func TestQuantizeErrors(t *testing.T) {
	const llama = `"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
		"num_attention_heads": 2, "vocab_size": 10`
	cases := map[string]struct{ quant, want string }{
		"unknown method":       {`{"quant_method": "awq", "bits": 4}`, `quant_method "awq": headeronly writes fp8`},
		"fp8 without blocks":   {`{"quant_method": "fp8"}`, "weight_block_size []: headeronly writes block scales"},
		"fp8 static":           {`{"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}`, `activation_scheme "static"`},
		"fp8 e5m2":             {`{"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}`, `fmt "e5m2"`},
		"bad exclusion regexp": {`{"quant_method": "fp8", "weight_block_size": [1, 1], "modules_to_not_convert": ["re:("]}`, `pattern "re:("`},
		"ct int4": {`{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"targets": ["Linear"],
			"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}`, "float-quantized 8-bit float weights"},
		"ct static activations": {`{"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"targets": ["Linear"],
			"input_activations": {"dynamic": false, "num_bits": 8, "type": "float", "strategy": "tensor"},
			"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}`, "static activation scales"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Tensors([]byte(`{`+llama+`, "quantization_config": `+tc.quant+`}`), "BF16")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// A quantised weight's scales go in its shard, as one tensor: a limit of
// 9 splits a, a's scale, b, b's scale [4 1 4 1] at the pair, not after b.
func TestSplitKeepsScalesWithWeight(t *testing.T) {
	ts := []sized{{Tensor{Name: "a.weight"}, 4}, {Tensor{Name: "a.weight_scale_inv"}, 1},
		{Tensor{Name: "b.weight"}, 4}, {Tensor{Name: "b.weight_scale"}, 1}}
	var got [][]string
	for _, shard := range split(ts, 9) {
		var names []string
		for _, x := range shard {
			names = append(names, x.Name)
		}
		got = append(got, names)
	}
	if want := "[[a.weight a.weight_scale_inv] [b.weight b.weight_scale]]"; fmt.Sprint(got) != want {
		t.Errorf("split = %v, want %s", got, want)
	}
}

// TestFP8Releases writes the shipped FP8 release configs as sharded and
// checks their tensors: every decoder-layer Linear weight F8_E4M3 beside
// its scale, parameters (scales not counted) the BF16 releases' own.
func TestFP8Releases(t *testing.T) {
	cases := map[string]struct {
		base      string
		quantised int
		suffix    string
		shards    int
	}{
		// 94 layers × (4 attention + 128 × 3 expert projections).
		"qwen3-235b-a22b-fp8": {"qwen3-235b-a22b", 94 * (4 + 128*3), "_scale_inv", 48},
		// 3 dense layers × 7, 89 MoE layers and the MTP layer × (4 + 160 × 3 + 3 shared).
		"glm-4.6-fp8": {"glm-4.6", 3*7 + 90*(4+160*3+3), "_scale", 73},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := LoadRelease("../../bench/configs/" + name)
			if err != nil {
				t.Fatal(err)
			}
			base, err := Tensors(readConfig(t, tc.base), "BF16")
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			st, err := WriteRelease(dir, r)
			if err != nil {
				t.Fatal(err)
			}
			if st.Tensors != len(base)+tc.quantised || st.Shards != tc.shards {
				t.Errorf("%d tensors in %d shards, want %d in %d", st.Tensors, st.Shards, len(base)+tc.quantised, tc.shards)
			}
			c, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			var params, baseParams int64
			fp8 := 0
			for _, k := range c.Keys() {
				x, _ := c.Tensor(k)
				if x.DType == "F8_E4M3" {
					fp8++
				}
				if !strings.HasSuffix(k, tc.suffix) {
					params += x.Elements()
				}
			}
			for _, x := range base {
				n, _ := elements(x.Shape)
				baseParams += n
			}
			if fp8 != tc.quantised || params != baseParams {
				t.Errorf("%d F8_E4M3 weights, %d parameters; want %d, %d", fp8, params, tc.quantised, baseParams)
			}
			checkScalesBeside(t, c, tc.suffix)
			checkSparse(t, c, st)
		})
	}
}
