package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// --shard-size splits materialised weights as save_pretrained does, with
// an index; the summary lists every file; a bad size or a size without
// materialise is a usage error.
func TestMaterialisedWeightsAreSharded(t *testing.T) {
	t.Parallel()
	fixture := filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-bf16-sharded", "model")
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := strata(t, "export", fixture, "--out", out, "--plugin-dir", llamaDir, "--weights", "materialize", "--shard-size", "100kB")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	shards, _ := filepath.Glob(filepath.Join(out, "weights", "model-*-of-*.safetensors"))
	if len(shards) < 2 {
		t.Fatalf("%d shards for 100 kB: %v", len(shards), shards)
	}
	for _, f := range append(shards, filepath.Join(out, "weights", "model.safetensors.index.json")) {
		if !strings.Contains(stdout, f) {
			t.Errorf("the summary does not list %s:\n%s", f, stdout)
		}
		info, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".safetensors") && info.Size() > 100_000+4096 { // a header over the data limit
			t.Errorf("%s is %d bytes, over --shard-size", f, info.Size())
		}
	}
	// Exported again unsharded: the shards and their index go.
	if code, _, stderr := strata(t, "export", fixture, "--out", out, "--plugin-dir", llamaDir, "--weights", "materialize"); code != 0 {
		t.Fatalf("re-export: %s", stderr)
	}
	left, _ := filepath.Glob(filepath.Join(out, "weights", "*"))
	if len(left) != 1 || filepath.Base(left[0]) != "model.safetensors" {
		t.Errorf("after an unsharded re-export weights/ holds %v", left)
	}
	for _, args := range [][]string{{"--shard-size", "5XB", "--weights", "materialize"}, {"--shard-size", "1GB"}, {"--shard-size", "0", "--weights", "materialize"}} {
		code, _, stderr := strata(t, append([]string{"export", fixture, "--out", filepath.Join(t.TempDir(), "x"), "--plugin-dir", llamaDir}, args...)...)
		if code != 2 || !strings.Contains(stderr, "--shard-size") {
			t.Errorf("%v: exit %d, %s", args, code, stderr)
		}
	}
}

// --quiet silences progress, notes and the text summary; errors still
// print, and --json still gives its one object.
func TestQuiet(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := strata(t, "--quiet", "export", tinyLlama, "--out", out, "--plugin-dir", llamaDir)
	if code != 0 || stdout != "" || stderr != "" {
		t.Errorf("--quiet export: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = strata(t, "-q", "export", tinyLlama, "--out", out, "--plugin-dir", llamaDir, "--json")
	var v map[string]any
	if code != 0 || json.Unmarshal([]byte(stdout), &v) != nil || v["command"] != "export" {
		t.Errorf("-q --json: exit %d, stdout %q", code, stdout)
	}
	code, _, stderr = strata(t, "-q", "export", filepath.Join(t.TempDir(), "missing"), "--out", out, "--plugin-dir", llamaDir)
	if code == 0 || !strings.Contains(stderr, "error") {
		t.Errorf("-q hid an error: exit %d, %q", code, stderr)
	}
}

// convert --json is one object with what the text report says.
func TestConvertJSON(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := strata(t, "convert", tinyLlama, "--out", out, "--dtype", "bfloat16", "--json", "--plugin-dir", llamaDir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var s convertSummary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("%v: %q", err, stdout)
	}
	if s.Command != "convert" || !s.Finalized || s.Layers != 2 || len(s.Written) != 2 || s.DType != "bfloat16" || s.TensorBytes == 0 || len(s.Files) < 4 {
		t.Errorf("summary %+v", s)
	}
	for _, f := range s.Files {
		if info, err := os.Stat(f.Path); err != nil || info.Size() != f.Bytes {
			t.Errorf("%s: %v", f.Path, err)
		}
	}
}

// Every invalid option value is a usage error (exit 2), whichever package
// finds it, and the message names the flag; nothing is written.
func TestInvalidValuesExitTwo(t *testing.T) {
	t.Parallel()
	fixture := filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-bf16-sharded", "model")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"export", "--dtype", "fp16"}, `"fp16"`}, {[]string{"export", "--link", "hard"}, `--link "hard"`},
		{[]string{"export", "--weights", "lazy"}, `--weights "lazy"`}, {[]string{"export", "--weight-spec", "onnx"}, `--weight-spec "onnx"`},
		{[]string{"export", "--weight-spec", "qaic"}, "--weight-spec qaic needs --weights materialize"},
		{[]string{"export", "-j", "-1"}, "-j must be at least 1"},
		{[]string{"convert", "--quantize", "fp8"}, `--quantize "fp8"`}, {[]string{"convert", "--dtype", "fp16"}, `--dtype "fp16"`},
		{[]string{"convert", "--layers", "3-1"}, `--layers "3-1"`},
	} {
		args := tc.args
		out := filepath.Join(t.TempDir(), "out")
		code, _, stderr := strata(t, append([]string{args[0], fixture, "--out", out, "--plugin-dir", llamaDir}, args[1:]...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, want 2 saying %s:\n%s", args, code, tc.want, stderr)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v: %s was written", args, out)
		}
	}
}

// `strata help CMD` is `strata CMD --help`; an unknown topic or flag is a
// usage error that points at the right help once.
func TestHelpCommand(t *testing.T) {
	t.Parallel()
	if code, stdout, stderr := strata(t, "help", "export"); code != 0 || !strings.Contains(stdout, "strata export - ") {
		t.Errorf("help export: exit %d\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := strata(t, "help", "nosuch"); code != 2 || !strings.Contains(stderr, "nosuch") {
		t.Errorf("help nosuch: exit %d, want 2\n%s", code, stderr)
	}
	for args, where := range map[string]string{"--frobnicate": "see strata --help", "export --frobnicate": "see strata export --help"} {
		code, _, stderr := strata(t, strings.Fields(args)...)
		if code != 2 || !strings.Contains(stderr, where) || strings.Contains(stderr, "strata strata") {
			t.Errorf("%s: exit %d, want 2 and %q once:\n%s", args, code, where, stderr)
		}
	}
}

// -q silences progress and notes, not the report that is the whole point
// of archs, inspect and check.
func TestQuietKeepsReports(t *testing.T) {
	t.Parallel()
	exported := filepath.Join(t.TempDir(), "exported")
	if code, _, stderr := strata(t, "export", tinyLlama, "--out", exported, "--plugin-dir", llamaDir); code != 0 {
		t.Fatalf("export: %s", stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"archs"}, "llama"},
		{[]string{"inspect", tinyLlama}, "model_type"},
		{[]string{"check", exported}, "onnx runtime: loads it"},
	} {
		code, stdout, stderr := strata(t, append([]string{"-q"}, append(tc.args, "--plugin-dir", llamaDir)...)...)
		if code != 0 || !strings.Contains(strings.ToLower(stdout), tc.want) {
			t.Errorf("-q %v: exit %d, stdout %q (want %q), stderr %q", tc.args, code, stdout, tc.want, stderr)
		}
	}
}

// Without -v no raw plugin log line ([ERROR], a timestamp) reaches stderr,
// only strata's own error; -v shows them.
func TestPluginLogsOnlyWithVerbose(t *testing.T) {
	t.Parallel()
	raw := regexp.MustCompile(`\[(ERROR|WARN|INFO|DEBUG)\]|\d{4}-\d\d-\d\dT\d\d:\d\d`)
	for _, verbose := range []bool{false, true} {
		args := []string{"export", tinyLlama, "--out", filepath.Join(t.TempDir(), "o"), "--plugin-dir", fakeDirs["crash-on-plan"]}
		if verbose {
			args = append([]string{"-v"}, args...)
		}
		code, _, stderr := strata(t, args...)
		if code != 1 || !strings.Contains(stderr, "stopped responding") {
			t.Fatalf("-v %v: exit %d: %s", verbose, code, stderr)
		}
		if raw.MatchString(stderr) != verbose {
			t.Errorf("-v %v: raw plugin log lines shown %v:\n%s", verbose, !verbose, stderr)
		}
	}
}

// A plugin's panic still shows without -v, as strata's own lines; its
// other log lines do not.
func TestCrashLogKeepsPanics(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	log := pluginLogger(&out, false).Named("strata-plugin-x").Named("strata-plugin-x")
	log.Warn("plugin failed to exit gracefully")
	log.Error("plugin process exited", "error", "exit status 2")
	log.Error("panic: runtime error: index out of range [3] with length 3")
	log.Error("goroutine 1 [running]:")
	want := "strata: plugin strata-plugin-x: panic: runtime error: index out of range [3] with length 3\n" +
		"strata: plugin strata-plugin-x: goroutine 1 [running]:\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// inspect shows the plugin options that apply, the expert layout found in
// the keys and the quantisation, in text and in --json.
func TestInspectShowsOptionsExpertsAndQuantisation(t *testing.T) {
	t.Parallel()
	fixtures := filepath.Join(testbin.Root(), "conformance", "fixtures")
	for _, tc := range []struct {
		model, plugins, layout, quant string
		options                       bool
	}{
		{"qwen3moe-f32-top2-norm", qwenDir, "per-expert", "", true},
		{"qwen3moe-f32-fused-mixed", qwenDir, "fused", "", true},
		{"qwen3moe-fp8-block", qwenDir, "per-expert", "fp8", true},
		{"llama-bf16-sharded", llamaDir, "", "", false},
	} {
		model := filepath.Join(fixtures, tc.model, "model")
		code, stdout, stderr := strata(t, "inspect", model, "--json", "--plugin-dir", tc.plugins)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.model, code, stderr)
		}
		var r inspectReport
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatal(err)
		}
		layout := ""
		if r.ExpertLayout != nil {
			layout = r.ExpertLayout.Layout
		}
		method := ""
		if r.Quantization != nil {
			method = r.Quantization.Method
		}
		hasOption := slices.ContainsFunc(r.Options, func(o *pb.PluginOption) bool { return o.GetName() == "moe_strategy" })
		if layout != tc.layout || method != tc.quant || hasOption != tc.options {
			t.Errorf("%s: expert layout %q, quantisation %q, moe_strategy option %v; want %q, %q, %v", tc.model, layout, method, hasOption, tc.layout, tc.quant, tc.options)
		}
		_, text, _ := strata(t, "inspect", model, "--plugin-dir", tc.plugins)
		for row, want := range map[string]bool{"expert_layout": tc.layout != "", "options             --moe-strategy gather|dense": tc.options, "quantization": tc.quant != ""} {
			if strings.Contains(text, row) != want {
				t.Errorf("%s: text has %q: %v, want %v:\n%s", tc.model, row, !want, want, text)
			}
		}
	}
}
