package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --json prints one JSON object on stdout, and --stats - the stats there,
// with the facts of the text summary.
func TestMachineReadableResults(t *testing.T) {
	t.Parallel()
	compiler := fakeCompiler(t)
	cases := map[string]struct {
		args      []string
		stats     bool // stdout holds stats (alone or as "stats")
		result    bool // stdout holds the command's result
		wantFiles []string
	}{
		"export --json":            {args: []string{"export", tinyLlama, "--json"}, result: true, wantFiles: []string{"model.onnx", "weight_spec.json"}},
		"export --stats -":         {args: []string{"export", tinyLlama, "--stats", "-"}, stats: true},
		"export --json --stats -":  {args: []string{"export", tinyLlama, "--json", "--stats", "-"}, result: true, stats: true, wantFiles: []string{"model.onnx"}},
		"layerwise --json":         {args: []string{"export", tinyLlama, "--json", "--layerwise", "--keep-windows"}, result: true, wantFiles: []string{"windows/window_0_0.onnx", "windows/window_1_1.onnx", "export-manifest.json"}},
		"materialize --json":       {args: []string{"export", tinyLlama, "--json", "--weights", "materialize", "--weight-spec", "qaic"}, result: true, wantFiles: []string{"weights/model.safetensors", "weight_spec_qaic.json"}},
		"compile --json --dry-run": {args: []string{"compile", tinyLlama, "--json", "--dry-run"}, result: true, wantFiles: []string{"compile.sh", "specializations.json", "custom_io.yaml"}},
		"compile --json":           {args: []string{"compile", tinyLlama, "--json", "--compiler", compiler}, result: true, wantFiles: []string{"compile.sh"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "o")
			code, stdout, errOut := strata(t, append(tc.args, "--out", out, "--plugin-dir", llamaDir)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			dec := json.NewDecoder(strings.NewReader(stdout))
			var v map[string]any
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
			}
			if dec.More() {
				t.Fatalf("stdout holds more than one JSON value:\n%s", stdout)
			}
			if fileExists("-") || fileExists(filepath.Join(dir, "-")) {
				t.Error("--stats - wrote a file named -")
			}
			stats := v
			if tc.result {
				stats, _ = v["stats"].(map[string]any)
				if v["command"] != tc.args[0] {
					t.Errorf("command %v", v["command"])
				}
			}
			if tc.stats != (stats != nil && stats["wall_seconds"] != nil) {
				t.Errorf("stats: %v, want %v:\n%s", stats, tc.stats, stdout)
			}
			if !tc.result {
				return
			}
			files, _ := v["files"].([]any)
			if tc.args[0] == "compile" {
				if exp, _ := v["export"].(map[string]any); exp == nil || exp["layers"] != 2.0 {
					t.Errorf("compile --json lacks the export's summary:\n%s", stdout)
				}
				if tc.args[len(tc.args)-2] == "--compiler" && len(v["binaries"].([]any)) != 1 {
					t.Errorf("no binaries:\n%s", stdout)
				}
			} else if v["layers"] != 2.0 || v["graph_weights"] != 21.0 || v["checkpoint_bytes_read"].(float64) <= 0 {
				t.Errorf("summary:\n%s", stdout)
			}
			sizes := map[string]int64{}
			for _, f := range files {
				f := f.(map[string]any)
				rel, _ := filepath.Rel(out, f["path"].(string))
				sizes[filepath.ToSlash(rel)] = int64(f["bytes"].(float64))
			}
			for _, want := range tc.wantFiles {
				info, err := os.Stat(filepath.Join(out, want))
				if err != nil || sizes[want] != info.Size() {
					t.Errorf("files lacks %s with its size (%v): %v", want, err, sizes)
				}
			}
		})
	}
}
