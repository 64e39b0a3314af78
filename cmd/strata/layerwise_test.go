package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/internal/testbin"
)

func TestLayerwiseGuard(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	code, _, errOut := strata(t, "export", tinyLlama, "--out", out, "--layerwise", "--plugin-dir", fakeDirs["no-layerwise"])
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, errOut)
	}
	for _, want := range []string{"--layerwise", "does not support layerwise export of llama",
		"layers cannot be cut apart", "support --layerwise: fakearch (fake-no-layerwise)"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("error lacks %q:\n%s", want, errOut)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("the guard let the export create its output directory")
	}
	// The verdict is visible before exporting, too.
	_, archs, _ := strata(t, "archs", "--plugin-dir", fakeDirs["no-layerwise"])
	if !strings.Contains(archs, "layerwise: no (the fake plugin's layers cannot be cut apart)") {
		t.Errorf("archs does not show the verdict:\n%s", archs)
	}
}

func TestLayerwiseUsageErrors(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	cases := map[string]struct {
		args []string
		want string
	}{
		"zero window":         {[]string{"--layerwise", "--window-size", "0"}, "--window-size must be at least 1, got 0"},
		"negative window":     {[]string{"--layerwise", "--window-size", "-3"}, "--window-size must be at least 1, got -3"},
		"window without mode": {[]string{"--window-size", "2"}, "need --layerwise"},
		"keep without mode":   {[]string{"--keep-windows"}, "need --layerwise"},
		"zero jobs":           {[]string{"--layerwise", "-j", "0"}, "-j must be at least 1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"export", tinyLlama, "--out", out, "--plugin-dir", llamaDir}, tc.args...)
			code, _, errOut := strata(t, args...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant exit 2 and %q", code, errOut, tc.want)
			}
		})
	}
}

// TestKillAndResume kills layerwise exports that keep their windows at
// random moments. Whatever the moment, a model.onnx present is the complete
// one, and the next run finishes the export to exactly the bytes of an
// uninterrupted one, reusing the windows the killed runs wrote. (Without
// --keep-windows, windows of referenced weights are never written: a run
// rebuilds them all.)
func TestKillAndResume(t *testing.T) {
	plugins := ownPlugins(t, llamaDir) // its own: other tests' plugins run meanwhile
	t.Parallel()
	src := testbin.HeaderOnly(t, "llama-3.1-70b")
	args := func(out string) []string {
		return []string{"export", src, "--out", out, "--plugin-dir", plugins, "--layerwise", "--keep-windows", "-j", "1"}
	}
	clean := filepath.Join(t.TempDir(), "clean")
	start := time.Now()
	if out, err := exec.Command(strataBin, args(clean)...).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	duration := time.Since(start)
	want := read(t, filepath.Join(clean, "model.onnx"))

	out := filepath.Join(t.TempDir(), "out")
	rng := rand.New(rand.NewPCG(1, 2))
	interrupted := 0 // windows on disk when a kill left no model.onnx
	for i := 0; i < 40 && interrupted < 2; i++ {
		cmd := exec.Command(strataBin, args(out)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(duration))))
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		requireNoProcesses(t, plugins)
		got, err := os.ReadFile(filepath.Join(out, "model.onnx"))
		if err == nil && !bytes.Equal(got, want) {
			t.Fatalf("kill %d: a model.onnx is present but is not the complete model", i)
		}
		if err != nil {
			windows, _ := filepath.Glob(filepath.Join(out, "windows", "window_*.onnx"))
			interrupted = len(windows)
		}
	}
	if interrupted < 2 {
		t.Fatal("no kill landed after two windows were written; the resume is untested")
	}
	msg, err := exec.Command(strataBin, args(out)...).CombinedOutput()
	if err != nil {
		t.Fatalf("resume: %v\n%s", err, msg)
	}
	if !bytes.Equal(read(t, filepath.Join(out, "model.onnx")), want) {
		t.Error("the resumed export differs from an uninterrupted one")
	}
	// The resume keeps windows the killed run finished: the manifest is
	// written after the first window and then at most every saveEvery, so
	// with a second window on disk (-j 1) the first was recorded.
	var written, kept int
	if _, err := fmt.Sscanf(after(string(msg), "windows stitched: "), "%d written, %d unchanged", &written, &kept); err != nil {
		t.Fatalf("no window summary: %v\n%s", err, msg)
	}
	if kept > interrupted || kept == 0 || written+kept != 80 {
		t.Errorf("%d windows were on disk; the resume kept %d and wrote %d", interrupted, kept, written)
	}
}

func after(s, marker string) string {
	_, rest, _ := strings.Cut(s, marker)
	return rest
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// No environment variable changes what an export produces: the same bytes
// with a noisy environment, another working directory and a relative path.
func TestEnvironmentDoesNotChangeTheExport(t *testing.T) {
	t.Parallel()
	run := func(out string, env []string, dir, model string) {
		t.Helper()
		cmd := exec.Command(strataBin, "export", model, "--out", out, "--plugin-dir", llamaDir,
			"--layerwise", "--window-size", "1", "--keep-windows", "--subfunctions")
		cmd.Env, cmd.Dir = env, dir
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, msg)
		}
	}
	quiet := filepath.Join(t.TempDir(), "quiet")
	run(quiet, []string{"PATH=" + os.Getenv("PATH")}, "", tinyLlama)

	noisy := filepath.Join(t.TempDir(), "noisy")
	wd := filepath.Dir(tinyLlama)
	env := append(os.Environ(), "LANG=tr_TR.UTF-8", "LC_ALL=de_DE.UTF-8", "TZ=Pacific/Kiritimati", "HOME="+t.TempDir(),
		"GOMAXPROCS=1", "OMP_NUM_THREADS=3", "STRATA_DTYPE=float16", "STRATA_WINDOW_SIZE=7", "QEFF_HOME=/nowhere",
		"AIC_EXTERNAL_DATA_ROOT=/elsewhere", "TMPDIR="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir())
	run(noisy, env, wd, filepath.Base(tinyLlama))

	for _, name := range []string{"model.onnx", "weight_spec.json", "windows/window_0_0.onnx", "windows/window_1_1.onnx"} {
		if !bytes.Equal(read(t, filepath.Join(quiet, name)), read(t, filepath.Join(noisy, name))) {
			t.Errorf("%s differs with another environment", name)
		}
	}
}
