//go:build unix

// unix only: the sparse-file check reads syscall.Stat_t.Blocks.

package headeronly

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
)

const fiveGB = 5_000_000_000 // save_pretrained's default max_shard_size "5GB"

// TestLlama31 writes each shipped Llama 3.1 config as it is released (BF16,
// 5 GB shards) and checks the checkpoint strata opens against the release's
// known figures: shard counts 4/30/191 and the index total_size / 2.
func TestLlama31(t *testing.T) {
	cases := map[string]struct {
		tensors, shards int
		params          int64
	}{
		"llama-3.1-8b":   {291, 4, 8_030_261_248},
		"llama-3.1-70b":  {723, 30, 70_553_706_496},
		"llama-3.1-405b": {1137, 191, 405_853_388_800},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			config := readConfig(t, name)
			tensors, err := LlamaTensors(config, "BF16")
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			st, err := Write(dir, config, tensors, fiveGB)
			if err != nil {
				t.Fatal(err)
			}
			if st.Shards != tc.shards || st.Tensors != tc.tensors || st.TensorBytes != 2*tc.params {
				t.Errorf("Stats = %+v, want %d shards, %d tensors, %d tensor bytes", st, tc.shards, tc.tensors, 2*tc.params)
			}
			c, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			checkOpened(t, c, st, tc.tensors, tc.params)
			checkShardLimit(t, c, tensors, fiveGB)
			checkSparse(t, c, st)
			wantIndex := fileSize(t, filepath.Join(dir, indexFile))
			if want := int64(len(config)) + wantIndex + st.HeaderBytes; c.BytesRead != want {
				t.Errorf("BytesRead = %d, want config+index+headers = %d", c.BytesRead, want)
			}
			if got := readTotalSize(t, dir); got != st.TensorBytes {
				t.Errorf("index total_size = %d, want %d", got, st.TensorBytes)
			}
			if first := c.Shards[0].Name; first != fmt.Sprintf("model-00001-of-%05d.safetensors", tc.shards) {
				t.Errorf("first shard is %s", first)
			}
		})
	}
}

func readConfig(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "bench", "configs", name, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

func readTotalSize(t *testing.T, dir string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, indexFile))
	if err != nil {
		t.Fatal(err)
	}
	var idx struct {
		Metadata struct {
			TotalSize int64 `json:"total_size"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	return idx.Metadata.TotalSize
}

// checkOpened compares what checkpoint.Open found with what was written.
func checkOpened(t *testing.T, c *checkpoint.Checkpoint, st Stats, tensors int, params int64) {
	t.Helper()
	var elements, headers, apparent int64
	for _, k := range c.Keys() {
		tn, _ := c.Tensor(k)
		elements += tn.Elements()
	}
	for _, sh := range c.Shards {
		headers += sh.HeaderBytes
		apparent += sh.Size
	}
	if len(c.Keys()) != tensors || elements != params {
		t.Errorf("opened %d tensors, %d parameters; want %d, %d", len(c.Keys()), elements, tensors, params)
	}
	if len(c.Shards) != st.Shards || headers != st.HeaderBytes || apparent != st.ApparentBytes {
		t.Errorf("opened %d shards, %d header bytes, %d apparent; Stats %+v", len(c.Shards), headers, apparent, st)
	}
}

// checkShardLimit checks each shard's data fits the limit and that the
// split is in order and greedy: tensors fill shards in list order, and each
// shard's first tensor would not have fitted in the previous shard.
func checkShardLimit(t *testing.T, c *checkpoint.Checkpoint, tensors []Tensor, limit int64) {
	t.Helper()
	for _, sh := range c.Shards {
		if data := sh.Size - sh.HeaderBytes; data > limit {
			t.Errorf("%s holds %d data bytes, over %d", sh.Name, data, limit)
		}
	}
	var prev string
	for _, want := range tensors {
		tn, ok := c.Tensor(want.Name)
		if !ok {
			t.Fatalf("tensor %s missing", want.Name)
		}
		switch {
		case prev == "" || tn.Shard == prev:
		case tn.Shard < prev:
			t.Fatalf("%s is in %s, after tensors in %s: the split is out of order", tn.Key, tn.Shard, prev)
		default:
			last, _ := c.Shard(prev)
			if last.Size-last.HeaderBytes+tn.Length <= limit {
				t.Errorf("%s closed with room for %s (%d bytes)", prev, tn.Key, tn.Length)
			}
		}
		prev = tn.Shard
	}
}

// checkSparse checks the shards allocate under 1% of their apparent size.
func checkSparse(t *testing.T, c *checkpoint.Checkpoint, st Stats) {
	t.Helper()
	var allocated int64
	for _, sh := range c.Shards {
		info, err := os.Stat(sh.Path)
		if err != nil {
			t.Fatal(err)
		}
		allocated += info.Sys().(*syscall.Stat_t).Blocks * 512
	}
	if allocated <= 0 || allocated*100 >= st.ApparentBytes {
		t.Errorf("shards allocate %d bytes of %d apparent; want > 0 and < 1%%", allocated, st.ApparentBytes)
	}
}

// TestMatchesSavePretrained regenerates checkpoints transformers 5.24 saved
// and compares the shard split and every header byte for byte: a Llama with
// max_shard_size="120KB" (tied, 3 layers, GQA; two shards and an index), and
// a Qwen3-MoE with dense and sparse layers and 12 experts (one file).
func TestMatchesSavePretrained(t *testing.T) {
	cases := map[string]struct {
		fixture  string
		maxShard int64
		shards   int
	}{
		"llama sharded":     {"llama-bf16-sharded", 120_000, 2},
		"qwen3moe one file": {"qwen3moe-bf16-top4-sparse", fiveGB, 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ref := filepath.Join("..", "..", "conformance", "fixtures", tc.fixture, "model")
			config, err := os.ReadFile(filepath.Join(ref, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			tensors, err := Tensors(config, "BF16")
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if _, err := Write(dir, config, tensors, tc.maxShard); err != nil {
				t.Fatal(err)
			}
			shards, _ := filepath.Glob(filepath.Join(ref, "model*.safetensors"))
			if len(shards) != tc.shards {
				t.Fatalf("reference has shards %v, want %d", shards, tc.shards)
			}
			if tc.shards > 1 {
				if got, want := weightMap(t, dir), weightMap(t, ref); !mapsEqual(got, want) {
					t.Errorf("weight_map = %v\nwant %v", got, want)
				}
			}
			for _, path := range shards {
				name := filepath.Base(path)
				if got, want := rawHeader(t, filepath.Join(dir, name)), rawHeader(t, path); !bytes.Equal(got, want) {
					t.Errorf("%s header:\n%s\nwant\n%s", name, got, want)
				}
				if got, want := fileSize(t, filepath.Join(dir, name)), fileSize(t, path); got != want {
					t.Errorf("%s is %d bytes, want %d", name, got, want)
				}
			}
		})
	}
}

func weightMap(t *testing.T, dir string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, indexFile))
	if err != nil {
		t.Fatal(err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	return idx.WeightMap
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// rawHeader is a safetensors file's length prefix and JSON header.
func rawHeader(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n [8]byte
	if _, err := f.ReadAt(n[:], 0); err != nil {
		t.Fatal(err)
	}
	h := make([]byte, 8+binary.LittleEndian.Uint64(n[:]))
	if _, err := f.ReadAt(h, 0); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestTinyTiedWithBiases checks names, shapes and order for a config with
// every optional tensor switched on or off from the 3.1 releases.
func TestTinyTiedWithBiases(t *testing.T) {
	config := []byte(`{"model_type": "llama", "hidden_size": 8, "intermediate_size": 12,
		"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 16,
		"attention_bias": true, "mlp_bias": true, "tie_word_embeddings": true}`)
	tensors, err := LlamaTensors(config, "F32")
	if err != nil {
		t.Fatal(err)
	}
	// head_dim = 8/4 = 2, so q is 4×2 = 8 rows and k, v 2×2 = 4.
	layer0 := []string{
		"self_attn.q_proj.weight [8 8]", "self_attn.q_proj.bias [8]",
		"self_attn.k_proj.weight [4 8]", "self_attn.k_proj.bias [4]",
		"self_attn.v_proj.weight [4 8]", "self_attn.v_proj.bias [4]",
		"self_attn.o_proj.weight [8 8]", "self_attn.o_proj.bias [8]",
		"mlp.gate_proj.weight [12 8]", "mlp.gate_proj.bias [12]",
		"mlp.up_proj.weight [12 8]", "mlp.up_proj.bias [12]",
		"mlp.down_proj.weight [8 12]", "mlp.down_proj.bias [8]",
		"input_layernorm.weight [8]", "post_attention_layernorm.weight [8]",
	}
	want := []string{"model.embed_tokens.weight [16 8]"}
	for l := range 2 {
		for _, w := range layer0 {
			want = append(want, fmt.Sprintf("model.layers.%d.%s", l, w))
		}
	}
	want = append(want, "model.norm.weight [8]") // tied: no lm_head.weight
	got := make([]string, len(tensors))
	for i, tn := range tensors {
		if tn.DType != "F32" {
			t.Errorf("%s is %s, want F32", tn.Name, tn.DType)
		}
		got[i] = fmt.Sprintf("%s %v", tn.Name, tn.Shape)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tensors:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	dir := t.TempDir()
	st, err := Write(dir, config, tensors, 600) // 600 bytes forces several shards
	if err != nil {
		t.Fatal(err)
	}
	c, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Per layer: q, k, v, o with biases; gate, up, down with biases; 2 norms.
	perLayer := (64 + 8) + 2*(32+4) + (64 + 8) + 2*(96+12) + (96 + 8) + 2*8
	checkOpened(t, c, st, len(want), int64(16*8+2*perLayer+8))
	checkShardLimit(t, c, tensors, 600)
	checkContiguous(t, c)
}

// TestLlamaBiases checks attention_bias and mlp_bias each switch on their
// own modules' biases only.
func TestLlamaBiases(t *testing.T) {
	attn := []string{"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias"}
	mlp := []string{"mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"}
	cases := map[string]struct {
		attention, mlp bool
		want           []string
	}{
		"none":           {false, false, nil},
		"attention only": {true, false, attn},
		"mlp only":       {false, true, mlp},
		"both":           {true, true, append(slices.Clone(attn), mlp...)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			config := fmt.Sprintf(`{"hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1,
				"num_attention_heads": 2, "vocab_size": 10, "attention_bias": %v, "mlp_bias": %v}`, tc.attention, tc.mlp)
			tensors, err := LlamaTensors([]byte(config), "BF16")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, tn := range tensors {
				if strings.HasSuffix(tn.Name, ".bias") {
					got = append(got, strings.TrimPrefix(tn.Name, "model.layers.0."))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("biases %v, want %v", got, tc.want)
			}
		})
	}
}

// checkContiguous checks each shard's data is packed from the header's
// end to the file's end, as the safetensors library requires.
func checkContiguous(t *testing.T, c *checkpoint.Checkpoint) {
	t.Helper()
	for _, sh := range c.Shards {
		ts := slices.Clone(sh.Tensors)
		sort.Slice(ts, func(i, j int) bool { return ts[i].Offset < ts[j].Offset })
		at := sh.HeaderBytes
		for _, tn := range ts {
			if tn.Offset != at {
				t.Errorf("%s: %s at %d, want %d", sh.Name, tn.Key, tn.Offset, at)
			}
			at += tn.Length
		}
		if at != sh.Size || (sh.HeaderBytes-8)%8 != 0 {
			t.Errorf("%s: data ends at %d of %d; header %d bytes (want a multiple of 8)", sh.Name, at, sh.Size, sh.HeaderBytes-8)
		}
	}
}

// TestSingleShard checks a checkpoint that fits one shard is
// model.safetensors with no index, as save_pretrained writes it.
func TestSingleShard(t *testing.T) {
	config := []byte(`{"model_type": "llama", "hidden_size": 4, "intermediate_size": 8,
		"num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10, "head_dim": 6}`)
	tensors, err := LlamaTensors(config, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := Write(dir, config, tensors, fiveGB)
	if err != nil {
		t.Fatal(err)
	}
	names, _ := os.ReadDir(dir)
	var files []string
	for _, n := range names {
		files = append(files, n.Name())
	}
	if want := []string{configFile, singleFile}; !slices.Equal(files, want) || st.Shards != 1 {
		t.Errorf("files %v, %d shards; want %v, 1", files, st.Shards, want)
	}
	c, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// head_dim 6 (not 4/2) and kv heads defaulting to 2: q, k, v have 12 rows.
	for key, shape := range map[string][]int64{
		"model.layers.0.self_attn.k_proj.weight": {12, 4},
		"model.layers.0.self_attn.o_proj.weight": {4, 12},
		"lm_head.weight":                         {10, 4},
	} {
		if tn, ok := c.Tensor(key); !ok || !slices.Equal(tn.Shape, shape) {
			t.Errorf("%s = %+v, want shape %v", key, tn, shape)
		}
	}
	if want := int64(len(config)) + st.HeaderBytes; c.BytesRead != want {
		t.Errorf("BytesRead = %d, want %d", c.BytesRead, want)
	}
}

func TestSplit(t *testing.T) {
	cases := map[string]struct {
		sizes []int64
		limit int64
		want  [][]int64
	}{
		"greedy in order":            {[]int64{3, 3, 3}, 6, [][]int64{{3, 3}, {3}}},
		"exact fit":                  {[]int64{2, 4, 6}, 6, [][]int64{{2, 4}, {6}}},
		"oversized tensor alone":     {[]int64{1, 10, 1, 1}, 5, [][]int64{{1}, {10}, {1, 1}}},
		"oversized first tensor":     {[]int64{10, 1}, 5, [][]int64{{10}, {1}}},
		"no backfill of a later gap": {[]int64{4, 3, 1}, 5, [][]int64{{4}, {3, 1}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ts := make([]sized, len(tc.sizes))
			for i, s := range tc.sizes {
				ts[i] = sized{Tensor{Name: fmt.Sprint(i)}, s}
			}
			var got [][]int64
			for _, shard := range split(ts, tc.limit) {
				var sizes []int64
				for _, s := range shard {
					sizes = append(sizes, s.bytes)
				}
				got = append(got, sizes)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("split = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestHeaderOrder checks mixed dtypes are laid out as the safetensors
// library does: wider alignment first, then by name.
func TestHeaderOrder(t *testing.T) {
	shard := []sized{
		{Tensor{"b", "U8", []int64{3}}, 3},
		{Tensor{"a", "U8", []int64{1}}, 1},
		{Tensor{"z", "F32", []int64{2}}, 8},
		{Tensor{"s", "I64", nil}, 8},
	}
	raw, data := encodeHeader(shard)
	if data != 20 {
		t.Errorf("data = %d, want 20", data)
	}
	n := binary.LittleEndian.Uint64(raw)
	if int(n) != len(raw)-8 || n%8 != 0 {
		t.Fatalf("length prefix %d for %d header bytes; want equal and a multiple of 8", n, len(raw)-8)
	}
	want := `{"__metadata__":{"format":"pt"},` +
		`"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},` +
		`"z":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},` +
		`"a":{"dtype":"U8","shape":[1],"data_offsets":[16,17]},` +
		`"b":{"dtype":"U8","shape":[3],"data_offsets":[17,20]}}`
	if got := strings.TrimRight(string(raw[8:]), " "); got != want {
		t.Errorf("header\n%s\nwant\n%s", got, want)
	}
}

func TestErrors(t *testing.T) {
	llama := `{"model_type": "llama", "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10}`
	good := []Tensor{{"w", "BF16", []int64{2}}}
	cases := map[string]struct {
		run  func(dir string) error
		want []string
	}{
		"unknown model_type": {
			run:  func(string) error { _, err := Tensors([]byte(`{"model_type": "gpt2"}`), "BF16"); return err },
			want: []string{`model_type "gpt2" is not supported`, "supported: deepseek_v3, glm4_moe, glm4_moe_lite, gpt_oss, kimi_k2, llama, qwen3_5, qwen3_5_moe, qwen3_5_moe_text, qwen3_5_text, qwen3_moe, qwen3_next, qwen3_vl, qwen3_vl_moe"},
		},
		"missing model_type": {
			run:  func(string) error { _, err := Tensors([]byte(`{}`), "BF16"); return err },
			want: []string{`"model_type" is missing`},
		},
		"missing llama field": {
			run:  func(string) error { _, err := LlamaTensors([]byte(`{"model_type": "llama"}`), "BF16"); return err },
			want: []string{`"hidden_size" is missing`},
		},
		"unknown dtype": {
			run:  func(string) error { _, err := LlamaTensors([]byte(llama), "bf16"); return err },
			want: []string{`unknown safetensors dtype "bf16"`},
		},
		"non-positive shard size": {
			run:  func(dir string) error { _, err := Write(dir, []byte(llama), good, 0); return err },
			want: []string{"must be positive"},
		},
		"duplicate tensor": {
			run:  func(dir string) error { _, err := Write(dir, []byte(llama), append(good, good...), 10); return err },
			want: []string{"tensor w is listed twice"},
		},
		"negative dimension": {
			run: func(dir string) error {
				_, err := Write(dir, []byte(llama), []Tensor{{"w", "BF16", []int64{-1}}}, 10)
				return err
			},
			want: []string{"tensor w", "negative dimension"},
		},
		"refuses to overwrite": {
			run: func(dir string) error {
				if _, err := Write(dir, []byte(llama), good, 10); err != nil {
					return err
				}
				_, err := Write(dir, []byte(llama), good, 10)
				return err
			},
			want: []string{"config.json already exists"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.run(t.TempDir())
			if err == nil {
				t.Fatalf("no error; want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestQwen3_235B writes the Qwen3-235B-A22B config as released (BF16, per-
// expert keys, "4GB" shards): 36,945 tensors in 118 shards, 235,093,634,560
// parameters (the release's index total_size 470,187,269,120 / 2).
func TestQwen3_235B(t *testing.T) {
	config := readConfig(t, "qwen3-235b-a22b")
	tensors, err := Tensors(config, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	const perLayer = 4 + 2 + 1 + 128*3 + 2 // attention, q/k norms, router, experts, layer norms
	wantTensors, params := 3+94*perLayer, int64(235_093_634_560)
	const fourGB = 4_000_000_000
	dir := t.TempDir()
	st, err := Write(dir, config, tensors, fourGB)
	if err != nil {
		t.Fatal(err)
	}
	if st.Tensors != wantTensors || st.TensorBytes != 2*params || st.Shards != 118 {
		t.Errorf("Stats = %+v, want %d tensors in 118 shards, %d tensor bytes", st, wantTensors, 2*params)
	}
	c, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkOpened(t, c, st, wantTensors, params)
	checkShardLimit(t, c, tensors, fourGB)
	checkSparse(t, c, st)
}

// TestGLM46 writes the GLM-4.6 config (92 layers, the first 3 dense, 160
// experts, q/k norms, q/k/v biases) with its inlined MTP layer 92: 3 dense
// layers of 14 tensors, 89 MoE layers and the MoE MTP layer of 496 (480
// per-expert, router weight and correction bias, 3 shared-expert), the MTP
// layer's 4 NextN tensors, embedding, norm and head.
func TestGLM46(t *testing.T) {
	config := readConfig(t, "glm-4.6")
	tensors, err := Tensors(config, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	want := 3*14 + 89*496 + 496 + 4 + 3
	if len(tensors) != want {
		t.Errorf("%d tensors, want %d", len(tensors), want)
	}
	has := map[string]Tensor{}
	for _, x := range tensors {
		has[x.Name] = x
	}
	for _, k := range []string{"model.layers.92.eh_proj.weight", "model.layers.92.mlp.experts.159.down_proj.weight",
		"model.layers.91.self_attn.q_norm.weight", "model.layers.2.mlp.gate_proj.weight"} {
		if _, ok := has[k]; !ok {
			t.Errorf("no tensor %s", k)
		}
	}
	if b := has["model.layers.3.mlp.gate.e_score_correction_bias"]; b.DType != "F32" {
		t.Errorf("correction bias %+v, want F32", b)
	}
	for _, k := range []string{"model.layers.2.mlp.gate.weight", "model.layers.92.shared_head.head.weight", "model.layers.0.self_attn.o_proj.bias"} {
		if _, ok := has[k]; ok {
			t.Errorf("unexpected tensor %s", k)
		}
	}
}
