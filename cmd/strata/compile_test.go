package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
)

// fakeCompiler writes a qaic-compile stand-in that creates the binary
// directory it is given, records its arguments there (one per line, in
// args.txt: nothing but the binary directory is the compiler's to write),
// and exits with $FAKE_EXIT after printing $FAKE_STDERR.
func fakeCompiler(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qaic-compile")
	script := `#!/bin/sh
for a in "$@"; do case "$a" in -aic-binary-dir=*) d="${a#-aic-binary-dir=}"; mkdir -p "$d"; echo qpc > "$d/programqpc.bin";; esac; done
for a in "$@"; do echo "$a"; done > "$d/args.txt"
[ -n "$FAKE_STDERR" ] && echo "$FAKE_STDERR" >&2
exit "${FAKE_EXIT:-0}"
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// compileRecord is everything a compile wrote that a reviewer checks
// against the reference conventions: the recorded command line and the
// files, with machine-specific paths replaced.
func compileRecord(t *testing.T, dir, compiler string) string {
	t.Helper()
	var b strings.Builder
	for _, name := range []string{"qpc/args.txt", "specializations.json", "custom_io.yaml", "mdp_ts_4.json", "compile.sh"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		// strata's own run gives the compiler a temporary binary directory,
		// adopted as qpc when it succeeds.
		data = binaryDirArg.ReplaceAll(data, []byte("-aic-binary-dir=TEMPORARY_DIR/qpc"))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "== %s\n%s\n", name, strings.ReplaceAll(string(data), compiler, "FAKE_QAIC_COMPILE"))
	}
	return b.String()
}

var binaryDirArg = regexp.MustCompile(`-aic-binary-dir=/\S+/\.strata-tmp-[^/\s]+/qpc`)

func TestCompileQAIC(t *testing.T) {
	t.Parallel()
	compiler := fakeCompiler(t)
	cases := map[string]struct {
		export, compile []string
	}{
		"plain": {nil, []string{"--ctx-len", "128", "--prefill-seq-len", "32"}},
		"continuous-batching": {[]string{"--continuous-batching"},
			[]string{"--ctx-len", "256", "--prefill-seq-len", "64", "--full-batch-size", "4"}},
		"ccl": {[]string{"--ccl"}, []string{"--ctx-len", "4096", "--prefill-seq-len", "128",
			"--comp-ctx-lengths-prefill", "1024,2048", "--comp-ctx-lengths-decode", "2048,4096"}},
		"ccl-continuous-batching": {[]string{"--ccl", "--continuous-batching"}, []string{"--ctx-len", "2048",
			"--full-batch-size", "8", "--kv-cache-batch-size", "16", "--comp-ctx-lengths-prefill", "1024", "--comp-ctx-lengths-decode", "1024,2048"}},
		"four-devices": {nil, []string{"--num-devices", "4", "--num-cores", "14"}},
		"mxfp6-mxint8": {nil, []string{"--mxfp6-matmul", "--mxint8-kv-cache"}},
		"subfunctions": {[]string{"--subfunctions"}, []string{"--subfunctions"}},
		"all-flags": {nil, []string{"--mos", "1", "--aic-enable-depth-first", "--split-retained-state-io",
			"--aic-hw-version", "ai200", "--compiler-flag=-user-tiled", "--compiler-flag=-node-precision-info=npi.yaml"}},
		"one-token-prefill": {nil, []string{"--prefill-seq-len", "1"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "compiled")
			args := append([]string{"compile", tinyLlama, "--out", out, "--plugin-dir", llamaDir, "--compiler", compiler}, tc.export...)
			code, stdout, stderr := strata(t, append(args, tc.compile...)...)
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, stderr)
			}
			if !fileExists(filepath.Join(out, "qpc", "programqpc.bin")) || fileExists(filepath.Join(out, "qpc.partial")) {
				t.Error("the binary directory was not renamed into place")
			}
			if !strings.Contains(stdout, "compiled to "+filepath.Join(out, "qpc")) {
				t.Errorf("stdout:\n%s", stdout)
			}
			golden(t, filepath.Join("compile", name), compileRecord(t, out, compiler))
		})
	}
}

func TestCompilePerWindow(t *testing.T) {
	t.Parallel()
	compiler := fakeCompiler(t)
	out := filepath.Join(t.TempDir(), "compiled")
	code, stdout, stderr := strata(t, "compile", tinyLlama, "--out", out, "--plugin-dir", llamaDir, "--compiler", compiler,
		"--layerwise", "--compile-per-window", "-j", "2", "--ctx-len", "256")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	windows, _ := filepath.Glob(filepath.Join(out, "windows", "window_*"))
	sort.Strings(windows)
	if len(windows) != 2 || strings.Count(stdout, "compiled ") != 2 {
		t.Fatalf("windows %v, stdout:\n%s", windows, stdout)
	}
	var record strings.Builder
	for _, w := range windows {
		if !fileExists(filepath.Join(w, "qpc", "programqpc.bin")) {
			t.Errorf("%s: no qpc", w)
		}
		fmt.Fprintf(&record, "#### %s\n%s", filepath.Base(w), compileRecord(t, w, compiler))
	}
	golden(t, filepath.Join("compile", "per-window"), record.String())
}

func TestCompileFailureLeavesNoBinary(t *testing.T) {
	compiler := fakeCompiler(t)
	out := filepath.Join(t.TempDir(), "compiled")
	t.Setenv("FAKE_EXIT", "3")
	t.Setenv("FAKE_STDERR", "error: the graph is too big for one device")
	code, _, stderr := strata(t, "compile", tinyLlama, "--out", out, "--plugin-dir", llamaDir, "--compiler", compiler)
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"compilation failed (exit code 3)", "-network-specialization-config=specializations.json", "too big for one device"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("error lacks %q:\n%s", want, stderr)
		}
	}
	if fileExists(filepath.Join(out, "qpc")) || fileExists(filepath.Join(out, "qpc.partial")) {
		t.Error("a binary directory was left after the compiler failed")
	}
}

func TestCompileErrors(t *testing.T) {
	t.Parallel()
	exported := filepath.Join(t.TempDir(), "export")
	if code, _, stderr := strata(t, "export", tinyLlama, "--out", exported, "--plugin-dir", llamaDir); code != 0 {
		t.Fatal(stderr)
	}
	cases := map[string]struct {
		args []string
		want string
	}{
		"no compiler":            {[]string{exported, "--compiler", "/nonexistent/qaic-compile"}, "--compiler /nonexistent/qaic-compile"},
		"full batch without cb":  {[]string{exported, "--dry-run", "--full-batch-size", "4"}, "need an export made with --continuous-batching"},
		"ccl lists without ccl":  {[]string{exported, "--dry-run", "--comp-ctx-lengths-decode", "1024"}, "need an export made with --ccl"},
		"subfunctions inlined":   {[]string{exported, "--dry-run", "--subfunctions"}, "re-export" + "|export it with --subfunctions"},
		"export option":          {[]string{exported, "--dry-run", "--layerwise"}, "--layerwise is an export option"},
		"prefill past context":   {[]string{exported, "--dry-run", "--ctx-len", "16", "--prefill-seq-len", "32"}, "exceeds --ctx-len 16"},
		"unknown backend":        {[]string{exported, "--backend", "tensorrt"}, `unknown --backend "tensorrt"`},
		"per window, no windows": {[]string{exported, "--dry-run", "--compile-per-window"}, "has no window models"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "compiled")
			code, _, stderr := strata(t, append([]string{"compile", "--out", out, "--plugin-dir", llamaDir}, tc.args...)...)
			matched := false
			for _, want := range strings.Split(tc.want, "|") {
				matched = matched || want != "" && strings.Contains(stderr, want)
			}
			if code == 0 || !matched {
				t.Errorf("exit %d, stderr:\n%s\nwant %q", code, stderr, tc.want)
			}
		})
	}
}

var (
	glmOnce  sync.Once
	glmBuilt string
	glmErr   error
)

// glmPlugins is a directory holding the glm plugin, built once per run.
func glmPlugins(t *testing.T) string {
	t.Helper()
	glmOnce.Do(func() {
		glmBuilt = filepath.Join(filepath.Dir(llamaDir), "glm")
		_, glmErr = testbin.Build(glmBuilt, "strata-plugin-glm", "./cmd/strata-plugin-glm")
	})
	if glmErr != nil {
		t.Fatal(glmErr)
	}
	return glmBuilt
}

// An export with an MTP draft compiles both models: model.onnx into OUT,
// mtp.onnx into OUT/mtp with the same specialisations, its own cache IO
// and a compile.sh that finds ../export/mtp.onnx.
func TestCompileCompilesTheMTPDraft(t *testing.T) {
	t.Parallel()
	compiler := fakeCompiler(t)
	fixture := filepath.Join(testbin.Root(), "conformance", "fixtures", "glm-f32-mtp", "model")
	out := filepath.Join(t.TempDir(), "compiled")
	code, stdout, stderr := strata(t, "compile", fixture, "--out", out, "--plugin-dir", glmPlugins(t), "--compiler", compiler,
		"--ctx-len", "128", "--prefill-seq-len", "32", "--mtp", "draft")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	for _, dir := range []string{out, filepath.Join(out, "mtp")} {
		if !fileExists(filepath.Join(dir, "qpc", "programqpc.bin")) {
			t.Errorf("%s: no qpc", dir)
		}
		if !strings.Contains(stdout, "compiled to "+filepath.Join(dir, "qpc")) {
			t.Errorf("stdout does not say %s was compiled:\n%s", dir, stdout)
		}
	}
	args := string(read(t, filepath.Join(out, "mtp", "qpc", "args.txt")))
	if !strings.Contains(args, "-m=../export/mtp.onnx") {
		t.Errorf("the draft's compiler got:\n%s", args)
	}
	io := string(read(t, filepath.Join(out, "mtp", "custom_io.yaml")))
	if !strings.Contains(io, "past_key.2_RetainedState") || strings.Contains(io, "past_key.0") {
		t.Errorf("the draft's custom IO is not its own cache (layer 2):\n%s", io)
	}
	want := string(read(t, filepath.Join(out, "specializations.json")))
	if got := string(read(t, filepath.Join(out, "mtp", "specializations.json"))); got != want {
		t.Errorf("the draft's specialisations differ from the main model's:\n%s\n%s", got, want)
	}
	// Compiling the export again, as it is, rewrites both in place.
	if code, _, stderr := strata(t, "compile", filepath.Join(out, "export"), "--out", out, "--compiler", compiler, "--ctx-len", "128", "--prefill-seq-len", "32"); code != 0 {
		t.Fatalf("re-compile: exit %d:\n%s", code, stderr)
	}
}
