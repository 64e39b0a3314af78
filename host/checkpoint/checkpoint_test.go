package checkpoint

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nlpodyssey/safetensors"
)

const (
	shard1 = "model-00001-of-00002.safetensors"
	shard2 = "model-00002-of-00002.safetensors"
)

// wantErr fails unless err holds every substring of want, after replacing
// DIR with dir so cases can demand the offending path.
func wantErr(t *testing.T, err error, dir string, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("Open succeeded; want an error containing %q", want)
	}
	for _, w := range want {
		if w = strings.ReplaceAll(w, "DIR", dir); !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

func mustOpen(t *testing.T, dir string) *Checkpoint {
	t.Helper()
	c, err := Open(dir)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return c
}

func mustTensor(t *testing.T, c *Checkpoint, key string) *Tensor {
	t.Helper()
	tn, ok := c.Tensor(key)
	if !ok {
		t.Fatalf("tensor %s missing; keys %v", key, c.Keys())
	}
	return tn
}

func TestOpenSingleFile(t *testing.T) {
	dir := modelDir(t)
	entries := map[string]entry{
		"z.weight": {DType: "BF16", Shape: []int64{2, 3}, Offsets: [2]int64{0, 12}},
		"a.bias":   {DType: "F32", Shape: []int64{3}, Offsets: [2]int64{12, 24}},
		"m.scalar": {DType: "I64", Shape: []int64{}, Offsets: [2]int64{24, 32}},
	}
	headerLen := writeShard(t, filepath.Join(dir, singleFile), entries)
	c := mustOpen(t, dir)

	if want := []string{"a.bias", "m.scalar", "z.weight"}; !slices.Equal(c.Keys(), want) {
		t.Errorf("Keys = %v, want %v", c.Keys(), want)
	}
	for key, e := range entries {
		tn := mustTensor(t, c, key)
		if tn.DType != e.DType || !slices.Equal(tn.Shape, e.Shape) || tn.Shard != singleFile {
			t.Errorf("%s = %s %v in %s, want %s %v in %s", key, tn.DType, tn.Shape, tn.Shard, e.DType, e.Shape, singleFile)
		}
		if want := 8 + headerLen + e.Offsets[0]; tn.Offset != want {
			t.Errorf("%s Offset = %d, want %d", key, tn.Offset, want)
		}
		if want := e.Offsets[1] - e.Offsets[0]; tn.Length != want {
			t.Errorf("%s Length = %d, want %d", key, tn.Length, want)
		}
	}
	if c.ModelType != "llama" || !slices.Equal(c.Architectures, []string{"LlamaForCausalLM"}) {
		t.Errorf("ModelType %q Architectures %v", c.ModelType, c.Architectures)
	}
	if len(c.Shards) != 1 || c.Shards[0].HeaderBytes != 8+headerLen || c.Shards[0].Size != 8+headerLen+32 {
		t.Errorf("Shards = %+v, want one of header %d, size %d", c.Shards, 8+headerLen, 8+headerLen+32)
	}
	var shardKeys []string
	for _, tn := range c.Shards[0].Tensors {
		shardKeys = append(shardKeys, tn.Key)
	}
	if !slices.Equal(shardKeys, c.Keys()) {
		t.Errorf("shard tensors %v, want sorted %v", shardKeys, c.Keys())
	}
	// Exactly config + length prefix + header: not one byte of tensor data.
	if want := int64(len(llamaConfig)) + 8 + headerLen; c.BytesRead != want {
		t.Errorf("BytesRead = %d, want %d", c.BytesRead, want)
	}
}

// TestOpenReferenceWriter proves the reader agrees with a file written by
// the reference Go library: every tensor's Offset/Length must address
// exactly the bytes that were serialized for it.
func TestOpenReferenceWriter(t *testing.T) {
	type ref struct {
		dtype safetensors.DType
		name  string
		shape []uint64
		data  []byte
	}
	refs := map[string]ref{
		"model.embed_tokens.weight": {safetensors.BF16, "BF16", []uint64{3, 2}, seq(12, 1)},
		"model.norm.weight":         {safetensors.F32, "F32", []uint64{2}, seq(8, 50)},
		"position_ids":              {safetensors.I64, "I64", []uint64{1, 2}, seq(16, 100)},
		"mask":                      {safetensors.U8, "U8", []uint64{5}, seq(5, 200)},
	}
	views := map[string]safetensors.TensorView{}
	for k, r := range refs {
		v, err := safetensors.NewTensorView(r.dtype, r.shape, r.data)
		if err != nil {
			t.Fatal(err)
		}
		views[k] = v
	}
	dir := modelDir(t)
	path := filepath.Join(dir, singleFile)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := safetensors.SerializeToWriter(views, map[string]string{"format": "pt"}, f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	c := mustOpen(t, dir)
	if len(c.Keys()) != len(refs) {
		t.Fatalf("Keys = %v, want %d", c.Keys(), len(refs))
	}
	for key, r := range refs {
		t.Run(key, func(t *testing.T) {
			tn := mustTensor(t, c, key)
			if tn.DType != r.name || len(tn.Shape) != len(r.shape) {
				t.Fatalf("%s %v, want %s %v", tn.DType, tn.Shape, r.name, r.shape)
			}
			for i := range r.shape {
				if uint64(tn.Shape[i]) != r.shape[i] {
					t.Fatalf("shape %v, want %v", tn.Shape, r.shape)
				}
			}
			if got := file[tn.Offset : tn.Offset+tn.Length]; !bytes.Equal(got, r.data) {
				t.Errorf("bytes at [%d,%d) = %v, want %v", tn.Offset, tn.Offset+tn.Length, got, r.data)
			}
		})
	}
}

// seq is n distinct bytes starting at from, so misplaced offsets show.
func seq(n int, from byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = from + byte(i)
	}
	return b
}

func TestOpenSharded(t *testing.T) {
	dir := modelDir(t)
	h1 := writeShard(t, filepath.Join(dir, shard1), map[string]entry{
		"model.embed_tokens.weight": {DType: "BF16", Shape: []int64{4, 2}, Offsets: [2]int64{0, 16}},
		"model.norm.weight":         {DType: "BF16", Shape: []int64{2}, Offsets: [2]int64{16, 20}},
	})
	h2 := writeShard(t, filepath.Join(dir, shard2), map[string]entry{
		"lm_head.weight": {DType: "BF16", Shape: []int64{4, 2}, Offsets: [2]int64{0, 16}},
	})
	writeIndex(t, dir, map[string]string{
		"model.embed_tokens.weight": shard1,
		"model.norm.weight":         shard1,
		"lm_head.weight":            shard2,
	})
	c := mustOpen(t, dir)

	if want := []string{"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"}; !slices.Equal(c.Keys(), want) {
		t.Errorf("Keys = %v, want %v", c.Keys(), want)
	}
	for key, shard := range map[string]string{"model.embed_tokens.weight": shard1, "model.norm.weight": shard1, "lm_head.weight": shard2} {
		if tn := mustTensor(t, c, key); tn.Shard != shard {
			t.Errorf("%s in %s, want %s", key, tn.Shard, shard)
		}
	}
	if norm := mustTensor(t, c, "model.norm.weight"); norm.Offset != 8+h1+16 || norm.Length != 4 {
		t.Errorf("model.norm.weight at %d+%d, want %d+4", norm.Offset, norm.Length, 8+h1+16)
	}
	if head := mustTensor(t, c, "lm_head.weight"); head.Offset != 8+h2 {
		t.Errorf("lm_head.weight at %d, want %d", head.Offset, 8+h2)
	}
	if len(c.Shards) != 2 || c.Shards[0].Name != shard1 || c.Shards[1].Name != shard2 {
		t.Errorf("Shards = %+v, want %s and %s", c.Shards, shard1, shard2)
	}
	if sh, ok := c.Shard(shard2); !ok || sh.Path != filepath.Join(dir, shard2) {
		t.Errorf("Shard(%s) = %+v, %v", shard2, sh, ok)
	}
	want := int64(len(llamaConfig)) + fileSize(t, filepath.Join(dir, indexFile)) + 8 + h1 + 8 + h2
	if c.BytesRead != want {
		t.Errorf("BytesRead = %d, want config+index+headers = %d", c.BytesRead, want)
	}
}

// TestOpenDTypes covers the dtypes the reference library rejects (F8, F4)
// and checks their byte lengths.
func TestOpenDTypes(t *testing.T) {
	cases := map[string]struct {
		shape  []int64
		length int64
	}{
		"F8_E4M3": {[]int64{4, 8}, 32},
		"F8_E5M2": {[]int64{16}, 16},
		"F8_E8M0": {[]int64{4, 1}, 4},
		"U8":      {[]int64{5}, 5},
		"F4":      {[]int64{3, 5}, 8}, // 15 packed nibbles round up to 8 bytes
		"BF16":    {[]int64{3}, 6},
	}
	entries := map[string]entry{}
	var off int64
	for name, tc := range cases {
		entries["t."+name] = entry{DType: name, Shape: tc.shape, Offsets: [2]int64{off, off + tc.length}}
		off += tc.length
	}
	dir := modelDir(t)
	writeShard(t, filepath.Join(dir, singleFile), entries)
	c := mustOpen(t, dir)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tn := mustTensor(t, c, "t."+name)
			if tn.DType != name || tn.Length != tc.length || !slices.Equal(tn.Shape, tc.shape) {
				t.Errorf("%s %v %d bytes, want %s %v %d bytes", tn.DType, tn.Shape, tn.Length, name, tc.shape, tc.length)
			}
		})
	}
}

func TestOpenCorruptShard(t *testing.T) {
	bf16 := func(shape []int64, begin, end int64) entry {
		return entry{DType: "BF16", Shape: shape, Offsets: [2]int64{begin, end}}
	}
	valid := map[string]entry{"a": bf16([]int64{6}, 0, 12), "b": bf16([]int64{6}, 12, 24)}
	cases := map[string]struct {
		write func(t *testing.T, path string)
		want  []string
	}{
		"shorter than 8 bytes": {
			write: func(t *testing.T, path string) { writeFile(t, path, []byte{1, 2, 3, 4, 5}) },
			want:  []string{"5 bytes", "too short"},
		},
		"header length past end of file": {
			write: func(t *testing.T, path string) { writeRaw(t, path, 1000, []byte(`{}`), 10) },
			want:  []string{"header length 1000", "runs past the end"},
		},
		"header length implausibly large": {
			write: func(t *testing.T, path string) { writeRaw(t, path, 1<<40, []byte(`{}`), 0) },
			want:  []string{"implausibly large"},
		},
		"invalid header JSON": {
			write: func(t *testing.T, path string) { writeRaw(t, path, 6, []byte(`{"a": `), 0) },
			want:  []string{"invalid header JSON"},
		},
		"header not an object": {
			write: func(t *testing.T, path string) { raw(t, path, `[1, 2]`, 0) },
			want:  []string{"invalid header JSON", "array, not an object"},
		},
		"tensor twice": {
			write: func(t *testing.T, path string) {
				raw(t, path, `{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8)
			},
			want: []string{"tensor w is in the header twice"},
		},
		"entry not an object": {
			write: func(t *testing.T, path string) { raw(t, path, `{"w":[1]}`, 0) },
			want:  []string{"tensor w", "array, not an object"},
		},
		"three data_offsets": {
			write: func(t *testing.T, path string) {
				raw(t, path, `{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, 8)
			},
			want: []string{"tensor w", "data_offsets: 3 numbers, not 2"},
		},
		"fractional dimension": {
			write: func(t *testing.T, path string) {
				raw(t, path, `{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, 4)
			},
			want: []string{"tensor w", "shape:", "1.5"},
		},
		"dtype not a string": {
			write: func(t *testing.T, path string) { raw(t, path, `{"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}}`, 4) },
			want:  []string{"tensor w", "dtype:"},
		},
		"unknown dtype": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, map[string]entry{"w": {DType: "F12", Shape: []int64{2}, Offsets: [2]int64{0, 3}}})
			},
			want: []string{"tensor w", `unknown dtype "F12"`},
		},
		"data_offsets span does not match shape and dtype": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, map[string]entry{"w": bf16([]int64{2, 3}, 0, 10)})
			},
			want: []string{"tensor w", "span 10 bytes", "needs 12"},
		},
		"end before begin": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, map[string]entry{"w": bf16([]int64{0}, 8, 4)})
			},
			want: []string{"tensor w", "invalid data_offsets [8, 4]"},
		},
		"negative dimension": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, map[string]entry{"w": bf16([]int64{-2, -3}, 0, 12)})
			},
			want: []string{"tensor w", "negative dimension"},
		},
		// 2^32 × 2^32 elements wraps int64 to 0, which matched an empty span.
		"element count overflows": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, map[string]entry{"w": bf16([]int64{1 << 32, 1 << 32}, 0, 0)})
			},
			want: []string{"tensor w", "too many elements"},
		},
		// 2^60 BF16 elements is 2^64 bytes, which wrapped to 0.
		"byte size overflows": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, map[string]entry{"w": bf16([]int64{1 << 30, 1 << 30}, 0, 0)})
			},
			want: []string{"tensor w", "too many elements"},
		},
		"truncated shard": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, valid)
				if err := os.Truncate(path, fileSize(t, path)-3); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"tensor b", "ends at byte 24", "only 21 data bytes", "truncated"},
		},
		"overlapping tensors": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, map[string]entry{"a": bf16([]int64{6}, 0, 12), "b": bf16([]int64{6}, 8, 20)})
			},
			want: []string{"tensors a and b overlap"},
		},
		// An empty tensor between them once hid the overlap of a and c.
		"overlap around an empty tensor": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, map[string]entry{
					"a":     bf16([]int64{16}, 0, 32),
					"empty": bf16([]int64{0}, 8, 8),
					"c":     bf16([]int64{4}, 16, 24),
				})
			},
			want: []string{"tensors a and c overlap"},
		},
		"unknown field in a header entry": {
			write: func(t *testing.T, path string) {
				writeShard(t, path, map[string]entry{"w": {DType: "BF16", Shape: []int64{1}, Offsets: [2]int64{0, 2}, Extra: map[string]any{"scale": 1}}})
			},
			want: []string{"tensor w", `unknown field "scale"`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := modelDir(t)
			tc.write(t, filepath.Join(dir, singleFile))
			_, err := Open(dir)
			wantErr(t, err, dir, append(tc.want, "DIR/"+singleFile)...)
		})
	}
}

func TestOpenBadIndex(t *testing.T) {
	one := func(key string) map[string]entry {
		return map[string]entry{key: {DType: "F32", Shape: []int64{1}, Offsets: [2]int64{0, 4}}}
	}
	two := func(a, b string) map[string]entry {
		return map[string]entry{
			a: {DType: "F32", Shape: []int64{1}, Offsets: [2]int64{0, 4}},
			b: {DType: "F32", Shape: []int64{1}, Offsets: [2]int64{4, 8}},
		}
	}
	cases := map[string]struct {
		setup func(t *testing.T, dir string)
		want  []string
	}{
		"index names a missing shard": {
			setup: func(t *testing.T, dir string) {
				writeShard(t, filepath.Join(dir, shard1), one("a"))
				writeIndex(t, dir, map[string]string{"a": shard1, "b": shard2})
			},
			want: []string{"DIR/" + indexFile, "names shard " + shard2, "missing"},
		},
		"key lives in another shard than the index says": {
			setup: func(t *testing.T, dir string) {
				writeShard(t, filepath.Join(dir, shard1), one("a"))
				writeShard(t, filepath.Join(dir, shard2), two("b", "c"))
				writeIndex(t, dir, map[string]string{"a": shard1, "b": shard2, "c": shard1})
			},
			want: []string{"DIR/" + indexFile, "disagrees", "c (in " + shard2 + "; the index says " + shard1 + ")"},
		},
		"key in no shard": {
			setup: func(t *testing.T, dir string) {
				writeShard(t, filepath.Join(dir, shard1), one("a"))
				writeIndex(t, dir, map[string]string{"a": shard1, "ghost": shard1})
			},
			want: []string{"DIR/" + indexFile, "ghost (in no shard; the index says " + shard1 + ")"},
		},
		"tensor in two shards": {
			setup: func(t *testing.T, dir string) {
				writeShard(t, filepath.Join(dir, shard1), one("a"))
				writeShard(t, filepath.Join(dir, shard2), two("a", "b"))
				writeIndex(t, dir, map[string]string{"a": shard1, "b": shard2})
			},
			want: []string{"tensor a is in both " + shard1 + " and " + shard2},
		},
		"empty weight_map": {
			setup: func(t *testing.T, dir string) {
				writeShard(t, filepath.Join(dir, shard1), one("a"))
				writeIndex(t, dir, map[string]string{})
			},
			want: []string{"DIR/" + indexFile, `empty or missing "weight_map"`},
		},
		"weight_map not an object": {
			setup: func(t *testing.T, dir string) {
				writeShard(t, filepath.Join(dir, shard1), one("a"))
				writeFile(t, filepath.Join(dir, indexFile), []byte(`{"weight_map": ["a"]}`))
			},
			want: []string{"DIR/" + indexFile, `"weight_map" is array, not an object`},
		},
		"shard not a string": {
			setup: func(t *testing.T, dir string) {
				writeShard(t, filepath.Join(dir, shard1), one("a"))
				writeFile(t, filepath.Join(dir, indexFile), []byte(`{"weight_map": {"a": 1}}`))
			},
			want: []string{"DIR/" + indexFile, "tensor a: the shard is number, not a file name"},
		},
		"trailing garbage": {
			setup: func(t *testing.T, dir string) {
				writeShard(t, filepath.Join(dir, shard1), one("a"))
				writeFile(t, filepath.Join(dir, indexFile), []byte(`{"weight_map": {"a": "`+shard1+`"}} x`))
			},
			want: []string{"DIR/" + indexFile, "invalid JSON"},
		},
		"invalid index JSON": {
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, indexFile), []byte(`{"weight_map": [`))
			},
			want: []string{"DIR/" + indexFile, "invalid JSON"},
		},
		// The escaping file exists, so only the name check can refuse it.
		"shard name escapes the directory": {
			setup: func(t *testing.T, dir string) {
				inner := filepath.Join(dir, "model")
				if err := os.Mkdir(inner, 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(inner, configFile), []byte(llamaConfig))
				writeShard(t, filepath.Join(dir, "outside.safetensors"), one("a"))
				writeIndex(t, inner, map[string]string{"a": "../outside.safetensors"})
			},
			want: []string{"DIR/model/" + indexFile, `shard "../outside.safetensors"`, "not a file name inside"},
		},
		"absolute shard name": {
			setup: func(t *testing.T, dir string) {
				writeShard(t, filepath.Join(dir, shard1), one("a"))
				writeIndex(t, dir, map[string]string{"a": filepath.Join(dir, shard1)})
			},
			want: []string{"DIR/" + indexFile, "not a file name inside"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := modelDir(t)
			tc.setup(t, dir)
			open := dir
			if _, err := os.Stat(filepath.Join(dir, "model")); err == nil {
				open = filepath.Join(dir, "model")
			}
			_, err := Open(open)
			wantErr(t, err, dir, tc.want...)
		})
	}
}

func TestOpenBadConfig(t *testing.T) {
	weights := func(t *testing.T, dir string) {
		writeShard(t, filepath.Join(dir, singleFile), map[string]entry{"a": {DType: "F32", Shape: []int64{1}, Offsets: [2]int64{0, 4}}})
	}
	cases := map[string]struct {
		config string // "" writes no config.json
		setup  func(t *testing.T, dir string)
		want   []string
		refuse []string // substrings that must not appear
	}{
		"config.json missing": {
			setup: weights,
			want:  []string{"DIR: no config.json"},
		},
		"config.json invalid JSON": {
			config: `{"model_type": "llama",`, setup: weights,
			want: []string{"DIR/" + configFile, "invalid JSON"},
		},
		"config.json without model_type": {
			config: `{"architectures": ["LlamaForCausalLM"]}`, setup: weights,
			want: []string{"DIR/" + configFile, `no "model_type"`},
		},
		"model_type not a string": {
			config: `{"model_type": 3}`, setup: weights,
			want: []string{"DIR/" + configFile, `no "model_type"`},
		},
		"no weights at all": {
			config: llamaConfig, setup: func(*testing.T, string) {},
			want:   []string{"DIR: no " + singleFile + " and no " + indexFile},
			refuse: []string{".bin"},
		},
		"only a PyTorch .bin": {
			config: llamaConfig,
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "pytorch_model.bin"), []byte("pickle"))
			},
			want: []string{"DIR: no " + singleFile, "pytorch_model.bin", "must be converted to safetensors"},
		},
		"shards without their index": {
			config: llamaConfig,
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), []byte("x"))
			},
			want:   []string{"model-00001-of-00002.safetensors", "needs its index"},
			refuse: []string{"PyTorch"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.config != "" {
				writeFile(t, filepath.Join(dir, configFile), []byte(tc.config))
			}
			tc.setup(t, dir)
			_, err := Open(dir)
			wantErr(t, err, dir, tc.want...)
			for _, r := range tc.refuse {
				if err != nil && strings.Contains(err.Error(), r) {
					t.Errorf("error %q mentions %q", err, r)
				}
			}
		})
	}
}

func TestOpenBadDir(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "file")
	writeFile(t, file, []byte(llamaConfig))
	cases := map[string]struct {
		dir      string
		want     []string
		notExist bool
	}{
		"does not exist": {dir: filepath.Join(root, "nope"), want: []string{filepath.Join(root, "nope")}, notExist: true},
		"is a file":      {dir: file, want: []string{file, "not a directory"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Open(tc.dir)
			wantErr(t, err, root, tc.want...)
			if got := errors.Is(err, fs.ErrNotExist); got != tc.notExist {
				t.Errorf("errors.Is(%v, fs.ErrNotExist) = %v, want %v", err, got, tc.notExist)
			}
		})
	}
}

// A tensor appended in parts reads back whole, and ReadTensorAt reads any
// part of it; a part past the declared size, a whole write over a started
// tensor, and a file closed mid-tensor are refused.
func TestWriterAppendsPartsReadTensorAtReadsThem(t *testing.T) {
	entries := []Entry{{Name: "a", DType: "U8", Shape: []int64{5}}, {Name: "b", DType: "U8", Shape: []int64{3}}}
	path := filepath.Join(t.TempDir(), "model.safetensors")
	w, err := CreateSafetensors(path, entries)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range [][]byte{{1, 2}, {}, {3, 4, 5}, {6}} {
		if err := w.Append(part); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Write([]byte{7, 8}); err == nil || !strings.Contains(err.Error(), "tensor b is partly appended (1 of 3 bytes)") {
		t.Errorf("a whole write over a started tensor: %v", err)
	}
	if err := w.Append([]byte{7, 8, 9}); err == nil || !strings.Contains(err.Error(), "more than the 3 bytes declared") {
		t.Errorf("a part past the declared size: %v", err)
	}
	if err := w.Append([]byte{7, 8}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := c.ReadTensor("a"); !bytes.Equal(got, []byte{1, 2, 3, 4, 5}) {
		t.Errorf("a = %v", got)
	}
	part := make([]byte, 2)
	if err := c.ReadTensorAt("b", part, 1); err != nil || !bytes.Equal(part, []byte{7, 8}) {
		t.Errorf("b[1:3] = %v, %v", part, err)
	}
	if err := c.ReadTensorAt("b", part, 2); err == nil || !strings.Contains(err.Error(), "outside its 3") {
		t.Errorf("a read past the tensor: %v", err)
	}

	w, err = CreateSafetensors(filepath.Join(t.TempDir(), "model.safetensors"), entries)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append([]byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), "0 of 2 tensors written") {
		t.Errorf("closed mid-tensor: %v", err)
	}
}

// Keys and shard names with JSON escapes (encoding/json writes "<" as
// \u003c) are read unescaped from the index, as from the headers.
func TestOpenIndexWithEscapedNames(t *testing.T) {
	dir := modelDir(t)
	const key, shard = "model.x<y&z>.weight", "model-<1>.safetensors"
	writeShard(t, filepath.Join(dir, shard), map[string]entry{key: {DType: "F32", Shape: []int64{1}, Offsets: [2]int64{0, 4}}})
	writeIndex(t, dir, map[string]string{key: shard})
	if data, _ := os.ReadFile(filepath.Join(dir, indexFile)); !strings.Contains(string(data), `\u003c`) {
		t.Fatalf("the index does not escape the names: %s", data)
	}
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tn, ok := c.Tensor(key); !ok || tn.Shard != shard {
		t.Fatalf("tensor %s: %+v, %v", key, tn, ok)
	}
}
