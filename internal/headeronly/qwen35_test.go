//go:build unix

package headeronly

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
)

// perExpert matches a per-expert key, which fused releases store stacked.
var perExpert = regexp.MustCompile(`mlp\.experts\.\d+\.`)

// TestQwen35Fixtures regenerates the checkpoints transformers 5.24 saved for
// the qwen35 plugin's conformance fixtures and compares every key, dtype and
// shape. The fixtures store experts per expert; the Qwen3.5-MoE generator
// stacks them as the Hub releases do (gate_up_proj [E, 2I, H], down_proj
// [E, H, I]). The Qwen3-Next generator adds the MTP layer every release
// ships; the fixtures have none.
func TestQwen35Fixtures(t *testing.T) {
	cases := map[string]struct {
		fused bool
		mtp   bool
	}{
		"qwen35-f32-dense":  {},
		"qwen35moe-bf16":    {fused: true},
		"qwen35moe-mm-bf16": {fused: true},
		"qwen3next-bf16":    {mtp: true},
		"qwen3next-f32":     {mtp: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ref := filepath.Join("..", "..", "conformance", "fixtures", name, "model")
			config, err := os.ReadFile(filepath.Join(ref, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			want := headerTensors(t, filepath.Join(ref, singleFile))
			tensors, err := Tensors(config, want["model.norm.weight"].DType+want["model.language_model.norm.weight"].DType)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]Tensor{}
			for _, x := range tensors {
				got[x.Name] = x
			}
			for k, w := range want {
				g, ok := got[k]
				switch {
				case !ok && tc.fused && perExpert.MatchString(k):
				case !ok:
					t.Errorf("%s %v missing", k, w.Shape)
				case g.DType != w.DType || !slices.Equal(g.Shape, w.Shape):
					t.Errorf("%s: %s %v, want %s %v", k, g.DType, g.Shape, w.DType, w.Shape)
				}
			}
			for k := range got {
				fusedKey := strings.HasSuffix(k, "mlp.experts.gate_up_proj") || strings.HasSuffix(k, "mlp.experts.down_proj")
				if _, ok := want[k]; !ok && !(tc.fused && fusedKey) && !(tc.mtp && strings.HasPrefix(k, "mtp.")) {
					t.Errorf("unexpected tensor %s", k)
				}
			}
		})
	}
}

// headerTensors reads a safetensors file's header.
func headerTensors(t *testing.T, path string) map[string]Tensor {
	t.Helper()
	raw := rawHeader(t, path)
	if n := binary.LittleEndian.Uint64(raw); int(n) != len(raw)-8 {
		t.Fatalf("%s: header length %d", path, n)
	}
	var h map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:], &h); err != nil {
		t.Fatal(err)
	}
	out := map[string]Tensor{}
	for k, v := range h {
		if k == "__metadata__" {
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(v, &e); err != nil {
			t.Fatal(err)
		}
		out[k] = Tensor{k, e.DType, e.Shape}
	}
	return out
}

// TestQwen35Releases writes Qwen3-Next-80B-A3B-Instruct (per-expert keys,
// 36 DeltaNet layers of 1,550 tensors, 12 attention layers of 1,549, the
// MTP layer's 1,553, 4 GB shards) and Qwen3.5-397B-A17B (fused experts: 45
// DeltaNet layers of 18, 15 attention layers of 15, the MTP layer's 19, a
// 27-block vision tower of 333) and checks counts, sizes and shapes. The
// latter's stacked experts (8.6 and 4.3 GB) are over the shard size: each
// is a shard of its own.
func TestQwen35Releases(t *testing.T) {
	cases := map[string]struct {
		tensors, shards int
		params          int64
		shapes          map[string][]int64
		oversized       bool // tensors over the shard size, each in a shard of its own
	}{
		"qwen3-next-80b-a3b-instruct": {36*1550 + 12*1549 + 3 + 1553, 41, 81_324_862_720, map[string][]int64{
			"model.layers.0.linear_attn.in_proj_qkvz.weight":  {2*16*128 + 2*32*128, 2048},
			"model.layers.0.linear_attn.in_proj_ba.weight":    {64, 2048},
			"model.layers.0.linear_attn.conv1d.weight":        {8192, 1, 4},
			"model.layers.0.linear_attn.norm.weight":          {128},
			"model.layers.3.self_attn.q_proj.weight":          {2 * 16 * 256, 2048},
			"model.layers.3.mlp.experts.511.down_proj.weight": {2048, 512},
			"mtp.fc.weight": {2048, 4096},
			"mtp.layers.0.mlp.experts.511.up_proj.weight": {512, 2048},
		}, false},
		"qwen3.5-397b-a17b": {333 + 45*18 + 15*15 + 3 + 19, 184, 403_397_928_944, map[string][]int64{
			"model.language_model.layers.0.linear_attn.in_proj_qkv.weight": {2*16*128 + 64*128, 4096},
			"model.language_model.layers.0.linear_attn.in_proj_a.weight":   {64, 4096},
			"model.language_model.layers.0.linear_attn.out_proj.weight":    {4096, 8192},
			"model.language_model.layers.3.self_attn.q_proj.weight":        {2 * 32 * 256, 4096},
			"model.language_model.layers.59.mlp.experts.gate_up_proj":      {512, 2048, 4096},
			"mtp.layers.0.mlp.experts.down_proj":                           {512, 4096, 1024},
			"model.visual.merger.linear_fc2.weight":                        {4096, 4608},
		}, true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := LoadRelease(filepath.Join("..", "..", "bench", "configs", name))
			if err != nil {
				t.Fatal(err)
			}
			tensors, err := Tensors(r.Config, "BF16")
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			st, err := WriteRelease(dir, r)
			if err != nil {
				t.Fatal(err)
			}
			if st.Tensors != tc.tensors || st.TensorBytes != 2*tc.params || st.Shards != tc.shards {
				t.Errorf("Stats = %+v, want %d tensors in %d shards, %d tensor bytes", st, tc.tensors, tc.shards, 2*tc.params)
			}
			c, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			checkOpened(t, c, st, tc.tensors, tc.params)
			checkSparse(t, c, st)
			if !tc.oversized {
				checkShardLimit(t, c, tensors, r.MaxShardBytes)
			}
			for _, sh := range c.Shards {
				if sh.Size-sh.HeaderBytes > r.MaxShardBytes && len(sh.Tensors) != 1 {
					t.Errorf("%s holds %d tensors and more than %d bytes", sh.Name, len(sh.Tensors), r.MaxShardBytes)
				}
			}
			for k, shape := range tc.shapes {
				if x, ok := c.Tensor(k); !ok || !slices.Equal(x.Shape, shape) {
					t.Errorf("%s = %+v, want shape %v", k, x, shape)
				}
			}
		})
	}
}

// TestQwen35Layouts checks layer kinds and MTP for each model type from
// tiny configs: which layers are DeltaNet, which MoE, where the keys go.
func TestQwen35Layouts(t *testing.T) {
	const text = `"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 2,
		"num_key_value_heads": 1, "head_dim": 8, "vocab_size": 32, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
		"linear_key_head_dim": 4, "linear_value_head_dim": 4, "linear_conv_kernel_dim": 3, "num_experts": 3,
		"moe_intermediate_size": 4, "shared_expert_intermediate_size": 6`
	cases := map[string]struct {
		config string
		want   []string // keys that must exist
		absent []string
	}{
		"qwen3_next sparse step 2, no MTP": {`{"model_type": "qwen3_next", ` + text + `, "decoder_sparse_step": 2, "num_nextn_predict_layers": 0}`,
			[]string{"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.experts.2.down_proj.weight", "model.layers.3.self_attn.q_norm.weight",
				"model.layers.2.linear_attn.in_proj_ba.weight"},
			[]string{"mtp.fc.weight", "model.layers.0.mlp.gate.weight", "model.layers.3.linear_attn.A_log"}},
		"qwen3_5_text layer_types, MTP": {`{"model_type": "qwen3_5_text", ` + text + `, "mtp_num_hidden_layers": 1,
			"layer_types": ["full_attention", "linear_attention", "linear_attention", "linear_attention"]}`,
			[]string{"model.layers.0.self_attn.o_proj.weight", "model.layers.3.linear_attn.in_proj_z.weight", "mtp.layers.0.mlp.up_proj.weight",
				"mtp.pre_fc_norm_hidden.weight"},
			[]string{"model.layers.0.linear_attn.A_log", "model.layers.1.mlp.gate.weight"}},
		"qwen3_5_moe multimodal tied": {`{"model_type": "qwen3_5_moe", "tie_word_embeddings": true, "text_config": {` + text + `}}`,
			[]string{"model.language_model.layers.0.mlp.experts.gate_up_proj", "model.language_model.layers.0.mlp.shared_expert_gate.weight",
				"model.language_model.norm.weight"},
			[]string{"lm_head.weight", "model.visual.merger.norm.weight", "mtp.fc.weight"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tensors, err := Tensors([]byte(tc.config), "F32")
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, x := range tensors {
				names = append(names, x.Name)
			}
			for _, k := range tc.want {
				if !slices.Contains(names, k) {
					t.Errorf("no tensor %s", k)
				}
			}
			for _, k := range tc.absent {
				if slices.Contains(names, k) {
					t.Errorf("unexpected tensor %s", k)
				}
			}
		})
	}
}

func TestQwen35Errors(t *testing.T) {
	const base = `"model_type": "qwen3_5_text", "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
		"num_attention_heads": 2, "vocab_size": 32, "linear_num_key_heads": 2, "linear_key_head_dim": 4,
		"linear_value_head_dim": 4, "linear_conv_kernel_dim": 3`
	cases := map[string]struct{ config, want string }{
		"value heads not a multiple": {`{` + base + `, "linear_num_value_heads": 3}`, "multiple of linear_num_key_heads"},
		"layer_types too short":      {`{` + base + `, "linear_num_value_heads": 2, "layer_types": ["full_attention"]}`, "lists 1 layers"},
		"unknown layer type":         {`{` + base + `, "linear_num_value_heads": 2, "layer_types": ["full_attention", "sliding"]}`, `"sliding"`},
		"missing linear field":       {`{"model_type": "qwen3_next", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 32}`, "linear_num_key_heads"},
		"no text_config":             {`{"model_type": "qwen3_5_moe"}`, "text_config is missing"},
		"MoE without shared expert": {`{` + strings.Replace(base, "qwen3_5_text", "qwen3_5_moe_text", 1) +
			`, "linear_num_value_heads": 2, "num_experts": 4, "moe_intermediate_size": 8}`, "shared_expert_intermediate_size"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Tensors([]byte(tc.config), "BF16")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func ExampleTensors_qwen3Next() {
	config := `{"model_type": "qwen3_next", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
		"head_dim": 4, "vocab_size": 16, "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 2,
		"linear_value_head_dim": 2, "linear_conv_kernel_dim": 4, "num_experts": 1, "moe_intermediate_size": 4,
		"shared_expert_intermediate_size": 4, "num_nextn_predict_layers": 0, "tie_word_embeddings": true}`
	tensors, _ := Tensors([]byte(config), "BF16")
	for _, x := range tensors {
		fmt.Println(x.Name, x.Shape)
	}
	// Output:
	// model.embed_tokens.weight [16 8]
	// model.layers.0.linear_attn.conv1d.weight [8 1 4]
	// model.layers.0.linear_attn.in_proj_qkvz.weight [12 8]
	// model.layers.0.linear_attn.in_proj_ba.weight [4 8]
	// model.layers.0.linear_attn.dt_bias [2]
	// model.layers.0.linear_attn.A_log [2]
	// model.layers.0.linear_attn.norm.weight [2]
	// model.layers.0.linear_attn.out_proj.weight [8 4]
	// model.layers.0.mlp.gate.weight [1 8]
	// model.layers.0.mlp.experts.0.gate_proj.weight [4 8]
	// model.layers.0.mlp.experts.0.up_proj.weight [4 8]
	// model.layers.0.mlp.experts.0.down_proj.weight [8 4]
	// model.layers.0.mlp.shared_expert.gate_proj.weight [4 8]
	// model.layers.0.mlp.shared_expert.up_proj.weight [4 8]
	// model.layers.0.mlp.shared_expert.down_proj.weight [8 4]
	// model.layers.0.mlp.shared_expert_gate.weight [1 8]
	// model.layers.0.input_layernorm.weight [8]
	// model.layers.0.post_attention_layernorm.weight [8]
	// model.norm.weight [8]
}
