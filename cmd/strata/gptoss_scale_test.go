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

// TestGptOss120BHeaderOnly exports a header-only gpt-oss-120b (the real
// config; MXFP4 experts in 15 shards, no tensor data on disk): whole,
// layerwise by single layers (stitched to the same bytes), and with layer
// functions, one per layer kind (sliding, full) in the order layer_types
// gives. The experts stay MXFP4: each binding reads the blocks and scales.
func TestGptOss120BHeaderOnly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := testbin.Build(dir, "strata-plugin-gptoss", "./cmd/strata-plugin-gptoss"); err != nil {
		t.Fatal(err)
	}
	src := testbin.HeaderOnly(t, "gpt-oss-120b")
	export := func(args ...string) (string, string) {
		t.Helper()
		out := filepath.Join(t.TempDir(), "out")
		code, stdout, errOut := strata(t, append([]string{"export", src, "--out", out, "--plugin-dir", dir}, args...)...)
		if code != 0 {
			t.Fatalf("export %v: exit %d: %s", args, code, errOut)
		}
		return out, stdout
	}
	whole, summary := export()
	for _, want := range []string{"36 layers", "(headers only)"} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
	var spec weights.Spec
	if err := json.Unmarshal(read(t, filepath.Join(whole, "weight_spec.json")), &spec); err != nil {
		t.Fatal(err)
	}
	if len(spec.Files) != 15 {
		t.Errorf("spec has %d files, want 15", len(spec.Files))
	}
	downs := 0
	for _, w := range spec.Weights {
		if strings.HasSuffix(w.Name, "/mlp.experts.down") {
			downs++
			if len(w.Sources) != 2 || !strings.HasSuffix(w.Sources[0].Key, "down_proj_blocks") || !strings.HasSuffix(w.Sources[1].Key, "down_proj_scales") {
				t.Fatalf("%s reads %+v, want the MXFP4 blocks and scales", w.Name, w.Sources)
			}
		}
	}
	if downs != 36 {
		t.Errorf("%d expert down projections, want 36", downs)
	}
	layerwise, _ := export("--layerwise", "--window-size", "1", "-j", "2")
	if !bytes.Equal(read(t, filepath.Join(whole, "model.onnx")), read(t, filepath.Join(layerwise, "model.onnx"))) {
		t.Error("the stitched layerwise model differs from the whole export")
	}
	functions, _ := export("--subfunctions")
	var calls []string
	for _, n := range readModel(t, filepath.Join(functions, "model.onnx")).GetGraph().GetNode() {
		if strings.HasPrefix(n.GetOpType(), "GptOss") && strings.HasSuffix(n.GetOpType(), "DecoderLayer") {
			calls = append(calls, n.GetOpType())
		}
	}
	if len(calls) != 36 || calls[0] != "GptOssSlidingDecoderLayer" || calls[1] != "GptOssDecoderLayer" || calls[35] != "GptOssDecoderLayer" {
		t.Errorf("layer calls %v, want sliding and full alternating from sliding, 36 in all", calls)
	}
	requireNoProcesses(t, dir)
}
