package headeronly

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestDeepseekMatchesTransformers: the names and shapes transformers saves
// for the MLA fixtures, q LoRA or q_proj, dense and MoE layers
// (num_nextn_predict_layers 0: transformers saves the field without MTP
// weights).
func TestDeepseekMatchesTransformers(t *testing.T) {
	for _, fixture := range []string{"deepseek-bf16-noqlora-yarn", "deepseek-f32-qlora-groups", "glm4lite-f32-qlora"} {
		t.Run(fixture, func(t *testing.T) {
			ref := filepath.Join("..", "..", "conformance", "fixtures", fixture, "model")
			config, err := os.ReadFile(filepath.Join(ref, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			var cfg map[string]any
			if err := json.Unmarshal(config, &cfg); err != nil {
				t.Fatal(err)
			}
			cfg["num_nextn_predict_layers"] = 0
			config, _ = json.Marshal(cfg)
			tensors, err := Tensors(config, "BF16")
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, x := range tensors {
				got[x.Name] = fmt.Sprint(x.Shape)
			}
			h := rawHeader(t, filepath.Join(ref, "model.safetensors"))
			var header map[string]struct {
				Shape []int64 `json:"shape"`
			}
			if err := json.Unmarshal(h[8:], &header); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{}
			for k, v := range header {
				if k != "__metadata__" {
					want[k] = fmt.Sprint(v.Shape)
				}
			}
			if !mapsEqual(got, want) {
				for k, v := range want {
					if got[k] != v {
						t.Errorf("%s: %q, transformers saves %s", k, got[k], v)
					}
				}
				for k := range got {
					if _, ok := want[k]; !ok {
						t.Errorf("%s: not in transformers' save", k)
					}
				}
			}
		})
	}
}

// TestDeepSeekV3FP8: 61 layers (3 dense) and the MTP layer with its own
// embedding and head; MLA projections in FP8 with a ceil block grid
// (kv_a_proj_with_mqa's 576 rows: 5 blocks of 128), norms and routers not.
func TestDeepSeekV3FP8(t *testing.T) {
	tensors, err := Tensors(readConfig(t, "deepseek-v3"), "BF16")
	if err != nil {
		t.Fatal(err)
	}
	has := map[string]Tensor{}
	for _, x := range tensors {
		has[x.Name] = x
	}
	for k, want := range map[string]string{
		"model.layers.0.self_attn.kv_a_proj_with_mqa.weight":           "F8_E4M3 [576 7168]",
		"model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv": "F32 [5 56]",
		"model.layers.0.self_attn.kv_b_proj.weight":                    "F8_E4M3 [32768 512]",
		"model.layers.0.self_attn.q_a_layernorm.weight":                "BF16 [1536]",
		"model.layers.60.mlp.experts.255.down_proj.weight_scale_inv":   "F32 [56 16]",
		"model.layers.3.mlp.gate.weight":                               "BF16 [256 7168]",
		"model.layers.61.embed_tokens.weight":                          "BF16 [129280 7168]",
		"model.layers.61.shared_head.head.weight":                      "BF16 [129280 7168]",
		"model.layers.61.eh_proj.weight":                               "BF16 [7168 14336]",
	} {
		x, ok := has[k]
		if got := fmt.Sprintf("%s %v", x.DType, x.Shape); !ok || got != want {
			t.Errorf("%s: %s (present %v), want %s", k, got, ok, want)
		}
	}
	if _, ok := has["model.layers.2.mlp.gate.weight"]; ok {
		t.Error("layer 2 is dense (first_k_dense_replace 3) but has a router")
	}
}
