package export

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/window"
	"github.com/strata-llm/strata/internal/testbin"
)

func open(t *testing.T, dir string) *checkpoint.Checkpoint {
	t.Helper()
	c, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func export(t *testing.T, ckpt *checkpoint.Checkpoint, out string, opts Options) *Result {
	t.Helper()
	return exportWith(t, llama, ckpt, out, opts)
}

func exportWith(t *testing.T, p *plugins.Plugin, ckpt *checkpoint.Checkpoint, out string, opts Options) *Result {
	t.Helper()
	opts.Out, opts.Version = out, "test"
	res, err := Run(context.Background(), p, ckpt, opts)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// outputs reads an export's model, spec and window files.
func outputs(t *testing.T, out string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for _, name := range []string{ModelFile, SpecFile} {
		data, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = data
	}
	windows, _ := filepath.Glob(filepath.Join(out, window.Dir, "*.onnx"))
	for _, w := range windows {
		data, err := os.ReadFile(w)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Join(window.Dir, filepath.Base(w))] = data
	}
	return files
}

// The stitched model is the whole export, byte for byte, for every window
// size, inlined or with subfunctions.
func TestStitchedIsTheWholeExport(t *testing.T) {
	cases := map[string]struct {
		ckpt  func(t *testing.T) string
		sizes []int
	}{
		"bf16 sharded fixture": {func(*testing.T) string {
			return filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-bf16-sharded", "model")
		}, []int{1, 2, 3, 4}},
		"Llama-3.1-8B header-only": {func(t *testing.T) string { return testbin.HeaderOnly(t, "llama-3.1-8b") },
			[]int{1, 3, 7, 16, 32, 33}},
	}
	for name, tc := range cases {
		ckpt := open(t, tc.ckpt(t))
		for _, sub := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/subfunctions=%v", name, sub), func(t *testing.T) {
				whole := outputs(t, func() string {
					out := filepath.Join(t.TempDir(), "whole")
					export(t, ckpt, out, Options{Subfunctions: sub})
					return out
				}())
				// Kept, the windows are written and stitched as built;
				// else only built.
				for _, keep := range []bool{false, true} {
					for _, size := range tc.sizes {
						out := filepath.Join(t.TempDir(), "layerwise")
						export(t, ckpt, out, Options{Subfunctions: sub, Layerwise: true, WindowSize: size, KeepWindows: keep})
						got := outputs(t, out)
						for _, f := range []string{ModelFile, SpecFile} {
							if !bytes.Equal(got[f], whole[f]) {
								t.Errorf("window size %d, kept %v: stitched %s differs from the whole export's", size, keep, f)
							}
						}
						if _, err := os.Stat(filepath.Join(out, window.Dir)); (err == nil) != keep {
							t.Errorf("window size %d, kept %v: windows/ there: %v", size, keep, err == nil)
						}
						if !keep && len(got) != 2 {
							t.Errorf("window size %d: files besides the model and spec without --keep-windows: %d files", size, len(got))
						}
					}
				}
			})
		}
	}
}

// With graph inputs of the plan's own (Qwen3-VL's vision inputs, and
// input_ids, which windows after the first declare too) the stitched model
// is still the whole export: each shared input appears once.
func TestStitchedWithExtraInputsIsTheWholeExport(t *testing.T) {
	ckpt := open(t, filepath.Join(testbin.Root(), "conformance", "fixtures", "qwen3vl-moe-f32-vision", "model"))
	for _, sub := range []bool{false, true} {
		opts := Options{Subfunctions: sub, PluginOptions: map[string]string{"vision": "true"}}
		out := filepath.Join(t.TempDir(), "whole")
		exportWith(t, qwen3vl, ckpt, out, opts)
		whole := outputs(t, out)
		for _, size := range []int{1, 2} {
			out := filepath.Join(t.TempDir(), "layerwise")
			lw := opts
			lw.Layerwise, lw.WindowSize = true, size
			exportWith(t, qwen3vl, ckpt, out, lw)
			if got := outputs(t, out); !bytes.Equal(got[ModelFile], whole[ModelFile]) || !bytes.Equal(got[SpecFile], whole[SpecFile]) {
				t.Errorf("subfunctions=%v window size %d: stitched differs from the whole export", sub, size)
			}
		}
	}
}

// Windows and model are the same bytes whatever -j, and on every re-run.
func TestLayerwiseIsDeterministic(t *testing.T) {
	ckpt := open(t, testbin.HeaderOnly(t, "llama-3.1-8b"))
	var runs []map[string][]byte
	for _, jobs := range []int{1, 4, 2} {
		out := filepath.Join(t.TempDir(), "out")
		export(t, ckpt, out, Options{Layerwise: true, WindowSize: 3, KeepWindows: true, Jobs: jobs})
		runs = append(runs, outputs(t, out))
	}
	if len(runs[0]) != 2+11 {
		t.Fatalf("%d files, want model, spec and 11 windows", len(runs[0]))
	}
	for i, r := range runs[1:] {
		for name, data := range runs[0] {
			if !bytes.Equal(r[name], data) {
				t.Errorf("run %d: %s differs from the -j 1 run", i+1, name)
			}
		}
	}
}

// A re-run keeps every window whose inputs are unchanged; changing one
// tensor's header entry rebuilds exactly the window that uses it.
func TestRerunSkipsUnchangedWindows(t *testing.T) {
	src := testbin.HeaderOnlyShards(t, "llama-3.1-8b", 200_000_000) // about one layer per shard
	out := filepath.Join(t.TempDir(), "out")
	opts := Options{Layerwise: true, WindowSize: 4, KeepWindows: true}
	first := export(t, open(t, src), out, opts)
	if len(first.WindowsWritten) != 8 || len(first.WindowsKept) != 0 {
		t.Fatalf("first run: written %v kept %v", first.WindowsWritten, first.WindowsKept)
	}
	again := export(t, open(t, src), out, opts)
	if len(again.WindowsWritten) != 0 || len(again.WindowsKept) != 8 {
		t.Errorf("unchanged re-run: written %v kept %v", again.WindowsWritten, again.WindowsKept)
	}
	before := outputs(t, out)

	retype(t, src, "model.layers.9.self_attn.q_proj.weight", "F16")
	changed := export(t, open(t, src), out, opts)
	if !slices.Equal(changed.WindowsWritten, []string{"8-11"}) || len(changed.WindowsKept) != 7 {
		t.Errorf("after changing layer 9: written %v kept %v; want only 8-11 rebuilt", changed.WindowsWritten, changed.WindowsKept)
	}
	after := outputs(t, out)
	if bytes.Equal(before["windows/window_8_11.onnx"], after["windows/window_8_11.onnx"]) || bytes.Equal(before[ModelFile], after[ModelFile]) {
		t.Error("the rebuilt window or the model did not change")
	}
	if !bytes.Equal(before["windows/window_0_3.onnx"], after["windows/window_0_3.onnx"]) {
		t.Error("an unchanged window changed")
	}
	checkManifestModel(t, out)
	export(t, open(t, src), out, Options{Layerwise: true, WindowSize: 4}) // windows let go
	checkManifestModel(t, out)
}

// checkManifestModel: the manifest's hash of model.onnx (computed as the
// model is written) is the file's.
func checkManifestModel(t *testing.T, out string) {
	t.Helper()
	m, err := window.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(out, ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(data); m.Model == nil || m.Model.File != ModelFile || m.Model.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("manifest records model %+v; model.onnx hashes to %x", m.Model, sum)
	}
}

// retype rewrites one tensor's dtype in its shard header in place, keeping
// the header's length (padding with spaces), so no other tensor moves.
func retype(t *testing.T, dir, key, dtype string) {
	t.Helper()
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, idx.WeightMap[key])
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		t.Fatal(err)
	}
	header := make([]byte, n)
	if _, err := f.ReadAt(header, 8); err != nil {
		t.Fatal(err)
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(header, &entries); err != nil {
		t.Fatal(err)
	}
	var e map[string]any
	if err := json.Unmarshal(entries[key], &e); err != nil {
		t.Fatal(err)
	}
	e["dtype"] = dtype
	if entries[key], err = json.Marshal(e); err != nil {
		t.Fatal(err)
	}
	edited, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	if len(edited) > len(header) {
		t.Fatalf("edited header is longer (%d > %d)", len(edited), len(header))
	}
	edited = append(edited, bytes.Repeat([]byte(" "), len(header)-len(edited))...)
	if _, err := f.WriteAt(edited, 8); err != nil {
		t.Fatal(err)
	}
}

// The guard runs before anything is written.
func TestLayerwiseOptionsAreCheckedFirst(t *testing.T) {
	ckpt := open(t, filepath.Join(testbin.Root(), "examples", "tiny-llama", "model"))
	out := filepath.Join(t.TempDir(), "out")
	_, err := Run(context.Background(), llama, ckpt, Options{Out: out, Layerwise: true, WindowSize: -2})
	if err == nil || !strings.Contains(err.Error(), "--window-size must be at least 1") {
		t.Errorf("window size -2: %v", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("the output directory was created although the options were wrong")
	}
}
