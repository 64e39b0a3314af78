package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/internal/testbin"
)

// TestQwen3_235BHeaderOnly exports a header-only Qwen3-235B-A22B (the real
// config; 36,945 per-expert tensors in 118 shards, no tensor data on disk):
// whole, layerwise by single layers (stitched to the same bytes), and with
// layer functions. Timings are for the benchmarks; this checks it works at
// full scale and reads headers only.
func TestQwen3_235BHeaderOnly(t *testing.T) {
	plugins := ownPlugins(t, qwenDir) // its own: other tests' plugins run meanwhile
	t.Parallel()
	src := testbin.HeaderOnly(t, "qwen3-235b-a22b")
	export := func(args ...string) (string, string) {
		t.Helper()
		out := filepath.Join(t.TempDir(), "out")
		code, stdout, errOut := strata(t, append([]string{"export", src, "--out", out, "--plugin-dir", plugins}, args...)...)
		if code != 0 {
			t.Fatalf("export %v: exit %d: %s", args, code, errOut)
		}
		return out, stdout
	}
	whole, summary := export()
	for _, want := range []string{"94 layers", "235.09 G parameters", "(headers only)"} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
	var spec weights.Spec
	if err := json.Unmarshal(read(t, filepath.Join(whole, "weight_spec.json")), &spec); err != nil {
		t.Fatal(err)
	}
	// Per layer: 8 attention/norm weights, the router, gate/up/down stacked
	// from 128 experts each; plus embedding, final norm, head.
	if len(spec.Weights) != 94*12+3 || len(spec.Files) != 118 {
		t.Errorf("spec has %d weights in %d files, want %d in 118", len(spec.Weights), len(spec.Files), 94*12+3)
	}
	stacked := 0
	for _, w := range spec.Weights {
		if strings.Contains(w.Name, "/mlp.experts.down") {
			stacked++
			if len(w.Sources) != 128 {
				t.Fatalf("%s stacks %d tensors, want 128", w.Name, len(w.Sources))
			}
		}
	}
	if stacked != 94 {
		t.Errorf("%d stacked down projections, want 94", stacked)
	}
	// Its initializers (megabytes of them encoded: written through the
	// export's spill file) are each checkpoint tensor the spec reads, once.
	sources := map[string]bool{}
	for _, w := range spec.Weights {
		for _, s := range w.Sources {
			sources[s.Key] = true
		}
	}
	inits := map[string]bool{}
	for _, init := range readModel(t, filepath.Join(whole, "model.onnx")).GetGraph().GetInitializer() {
		inits[init.GetName()] = true
	}
	if len(inits) != len(sources) {
		t.Errorf("model.onnx holds %d initializers, the spec reads %d tensors", len(inits), len(sources))
	}
	for k := range sources {
		if !inits[k] {
			t.Fatalf("tensor %s is read by the spec but no initializer of model.onnx", k)
		}
	}

	layerwise, _ := export("--layerwise", "--window-size", "1", "-j", "2")
	if !bytes.Equal(read(t, filepath.Join(whole, "model.onnx")), read(t, filepath.Join(layerwise, "model.onnx"))) {
		t.Error("the stitched layerwise model differs from the whole export")
	}
	functions, _ := export("--subfunctions")
	model := readModel(t, filepath.Join(functions, "model.onnx"))
	calls := 0
	for _, n := range model.GetGraph().GetNode() {
		if n.GetOpType() == "Qwen3MoeDecoderLayer" {
			calls++
		}
	}
	if calls != 94 {
		t.Errorf("%d calls of Qwen3MoeDecoderLayer, want 94", calls)
	}
	requireNoProcesses(t, plugins)
}
