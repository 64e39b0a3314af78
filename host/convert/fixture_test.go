package convert

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
)

// tensor is a test tensor: dtype, shape, bytes.
type tensor struct {
	dtype string
	shape []int64
	data  []byte
}

func f32(rng *rand.Rand, shape ...int64) tensor {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * 0.2)
	}
	return tensor{"F32", shape, encode(nil, "F32", v)}
}

func bf16(rng *rand.Rand, shape ...int64) tensor {
	t := f32(rng, shape...)
	return tensor{"BF16", shape, encode(nil, "BF16", decode(nil, "F32", t.data))}
}

// writeSafetensors writes tensors (sorted by name) to path.
func writeSafetensors(t *testing.T, path string, ts map[string]tensor) {
	t.Helper()
	names := make([]string, 0, len(ts))
	for n := range ts {
		names = append(names, n)
	}
	sort.Strings(names)
	var entries []checkpoint.Entry
	for _, n := range names {
		entries = append(entries, checkpoint.Entry{Name: n, DType: ts[n].dtype, Shape: ts[n].shape})
	}
	w, err := checkpoint.CreateSafetensors(path, entries)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := w.Write(ts[n].data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// model is a tiny Llama-shaped checkpoint: hidden h, layers decoder
// layers (plus whatever a test adds).
type model struct {
	config  map[string]any
	shards  map[string]map[string]tensor // file -> tensors
	indexed bool                         // write an index naming every shard but unindexed ones
	extra   map[string]map[string]tensor // files not in the index
	files   map[string]string            // other files (tokenizer...)
}

func llamaModel(seed uint64, layers int, dt string) *model {
	rng := rand.New(rand.NewPCG(seed, 1))
	mk := func(shape ...int64) tensor {
		if dt == "BF16" {
			return bf16(rng, shape...)
		}
		return f32(rng, shape...)
	}
	const h, inter, vocab = 64, 160, 96
	ts := map[string]tensor{
		"model.embed_tokens.weight": mk(vocab, h),
		"model.norm.weight":         mk(h),
		"lm_head.weight":            mk(vocab, h),
	}
	for i := range layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		for name, shape := range map[string][]int64{
			"self_attn.q_proj.weight": {h, h}, "self_attn.k_proj.weight": {32, h}, "self_attn.v_proj.weight": {32, h},
			"self_attn.o_proj.weight": {h, h}, "mlp.gate_proj.weight": {inter, h}, "mlp.up_proj.weight": {inter, h},
			"mlp.down_proj.weight": {h, inter}, "input_layernorm.weight": {h}, "post_attention_layernorm.weight": {h},
		} {
			ts[p+name] = mk(shape...)
		}
	}
	return &model{
		config: map[string]any{"model_type": "llama", "architectures": []string{"LlamaForCausalLM"}, "num_hidden_layers": layers,
			"hidden_size": h, "dtype": map[string]string{"F32": "float32", "BF16": "bfloat16"}[dt]},
		shards: map[string]map[string]tensor{"model.safetensors": ts},
		files:  map[string]string{"tokenizer.json": `{"model": {}}`, "generation_config.json": `{"do_sample": false}`},
	}
}

// all is every tensor of the model, any file.
func (m *model) all() map[string]tensor {
	out := map[string]tensor{}
	for _, g := range []map[string]map[string]tensor{m.shards, m.extra} {
		for _, ts := range g {
			for k, v := range ts {
				out[k] = v
			}
		}
	}
	return out
}

func (m *model) write(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.MarshalIndent(m.config, "", "  ")
	os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
	weightMap := map[string]string{}
	for file, ts := range m.shards {
		writeSafetensors(t, filepath.Join(dir, file), ts)
		for k := range ts {
			weightMap[k] = file
		}
	}
	for file, ts := range m.extra {
		writeSafetensors(t, filepath.Join(dir, file), ts)
	}
	if m.indexed {
		idx, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": weightMap})
		os.WriteFile(filepath.Join(dir, IndexFile), idx, 0o644)
	}
	for name, body := range m.files {
		os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644)
	}
	return dir
}

// output reads a converted directory: every tensor by name, the index, the
// config and the report.
type output struct {
	dir     string
	tensors map[string]tensor
	file    map[string]string
	index   struct {
		Metadata struct {
			TotalSize int64 `json:"total_size"`
		} `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	config map[string]any
	report report
}

func readOutput(t *testing.T, dir string) *output {
	t.Helper()
	o := &output{dir: dir, tensors: map[string]tensor{}, file: map[string]string{}}
	data, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatalf("no index: %v", err)
	}
	if err := json.Unmarshal(data, &o.index); err != nil {
		t.Fatal(err)
	}
	var total int64
	files := map[string]bool{}
	for k, f := range o.index.WeightMap {
		files[f] = true
		o.file[k] = f
	}
	for f := range files {
		ck, err := checkpoint.OpenFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ck.Keys() {
			tt, _ := ck.Tensor(k)
			b, err := ck.ReadTensor(k)
			if err != nil {
				t.Fatal(err)
			}
			o.tensors[k] = tensor{tt.DType, tt.Shape, b}
			total += tt.Length
			if o.index.WeightMap[k] != f {
				t.Errorf("index puts %s in %s, found in %s", k, o.index.WeightMap[k], f)
			}
		}
	}
	if total != o.index.Metadata.TotalSize {
		t.Errorf("index total_size %d, tensors hold %d bytes", o.index.Metadata.TotalSize, total)
	}
	data, _ = os.ReadFile(filepath.Join(dir, "config.json"))
	json.Unmarshal(data, &o.config)
	data, _ = os.ReadFile(filepath.Join(dir, ReportFile))
	if err := json.Unmarshal(data, &o.report); err != nil {
		t.Fatalf("report: %v", err)
	}
	return o
}

func (o *output) quantConfig() map[string]any {
	qc, _ := o.config["quantization_config"].(map[string]any)
	return qc
}

func (o *output) exclusions() []string {
	qc := o.quantConfig()
	var out []string
	for _, k := range []string{"modules_to_not_convert", "ignore"} {
		if l, ok := qc[k].([]any); ok {
			for _, s := range l {
				out = append(out, s.(string))
			}
		}
	}
	return out
}

func floats(tt tensor) []float32 { return decode(nil, tt.dtype, tt.data) }

func maxAbs(v []float32) float32 {
	var m float32
	for _, x := range v {
		m = max(m, float32(math.Abs(float64(x))))
	}
	return m
}

var _ = bytes.Equal
var _ = binary.LittleEndian
