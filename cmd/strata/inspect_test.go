package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
)

// vlmLike is tiny-llama's weights under a config whose language model is
// in text_config and whose model_type no plugin handles.
func vlmLike(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cfg := `{"model_type": "some_vlm", "architectures": ["SomeVLM"], "vision_config": {"hidden_size": 32},
	  "text_config": {"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
	    "vocab_size": 128, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
	    "rope_theta": 500000.0, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1,
	    "num_nextn_predict_layers": 1}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), read(t, filepath.Join(tinyLlama, "model.safetensors")), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestInspectKeyNumbers(t *testing.T) {
	t.Parallel()
	theta := func(f float64) *float64 { return &f }
	cases := map[string]struct {
		model string
		code  int
		want  archNumbers
		text  []string
	}{
		"llama": {model: tinyLlama, want: archNumbers{HiddenSize: 64, IntermediateSize: 96, Layers: 2, Heads: 8, KVHeads: 2, HeadDim: 8,
			VocabSize: 128, ContextLength: 128, RoPEType: "default", RoPETheta: theta(10000), DType: "bfloat16"},
			text: []string{"8 heads, 2 KV heads, head_dim 8", "1 file, 150.24 kB, 21 tensors", "default, theta 10000"}},
		"qwen3moe": {model: filepath.Join(testbin.Root(), "conformance", "fixtures", "qwen3moe-f32-top2-norm", "model"),
			want: archNumbers{HiddenSize: 64, IntermediateSize: 96, Layers: 2, Heads: 4, KVHeads: 4, HeadDim: 16, VocabSize: 128,
				ContextLength: 128, RoPEType: "default", RoPETheta: theta(10000), Experts: 8, ExpertsPerToken: 2, MoEIntermediateSize: 32, DType: "float32"},
			text: []string{"8, top-2, intermediate 32"}},
		"text_config, unsupported": {model: vlmLike(t), code: 1,
			want: archNumbers{HiddenSize: 64, Layers: 3, Heads: 8, KVHeads: 2, HeadDim: 8, VocabSize: 128, ContextLength: 4096,
				RoPEType: "yarn", RoPETheta: theta(500000), Experts: 16, ExpertsPerToken: 4, SharedExperts: 1, MTPLayers: 1, TextConfig: true},
			text: []string{"64 (text_config)", "16, top-4, 1 shared", "1 layer", "layerwise_supported no", "no plugin handles model_type some_vlm"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := strata(t, "inspect", "--json", tc.model, "--plugin-dir", llamaDir, "--plugin-dir", qwenDir)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, errOut)
			}
			if tc.code != 0 && !strings.Contains(errOut, "cannot export") {
				t.Errorf("stderr does not say why it failed:\n%s", errOut)
			}
			var r inspectReport
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			got, _ := json.Marshal(r.Config)
			want, _ := json.Marshal(tc.want)
			if string(got) != string(want) {
				t.Errorf("config numbers\n got %s\nwant %s", got, want)
			}
			if len(r.Shards) == 0 || r.Shards[0].Name != "model.safetensors" {
				t.Errorf("--json lacks the shard list: %+v", r.Shards)
			}
			code, text, _ := strata(t, "inspect", tc.model, "--plugin-dir", llamaDir, "--plugin-dir", qwenDir)
			if code != tc.code {
				t.Errorf("text: exit %d, want %d", code, tc.code)
			}
			for _, w := range tc.text {
				if !strings.Contains(text, w) {
					t.Errorf("text lacks %q:\n%s", w, text)
				}
			}
			if strings.Contains(text, "model.safetensors") {
				t.Errorf("text lists shards one by one:\n%s", text)
			}
		})
	}
}
