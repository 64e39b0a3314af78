package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// Every usage error exits 2 and says what is wrong; failures exit 1.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	out := func() string { return filepath.Join(t.TempDir(), "o") }
	cases := map[string]struct {
		args []string
		code int
		want string
	}{
		"unknown command":               {[]string{"exprot", tinyLlama}, 2, `unknown command "exprot": did you mean export?`},
		"unknown command, far":          {[]string{"frobnicate"}, 2, `unknown command "frobnicate" (strata --help`},
		"unknown command after flag":    {argv("--plugin-dir", llamaDir, "inspct"), 2, "did you mean inspect?"},
		"unknown flag":                  {[]string{"inspect", "--jsn", tinyLlama}, 2, "did you mean --json?"},
		"unknown global flag":           {[]string{"--plugin-dri", "x", "archs"}, 2, "did you mean --plugin-dir?"},
		"unknown bool-like flag":        {[]string{"export", tinyLlama, "--out", out(), "--layerwsie"}, 2, "flag provided but not defined: -layerwsie"},
		"unknown plugin option":         {[]string{"export", tinyLlama, "--out", out(), "--plugin-dir", llamaDir, "--bogus-opt", "1"}, 2, "unknown flag or plugin option --bogus-opt"},
		"missing --out":                 {[]string{"export", tinyLlama}, 2, `Required flag "out" not set`},
		"missing model":                 {[]string{"export", "--out", out()}, 2, "exactly one argument, MODEL"},
		"bad -j":                        {[]string{"export", tinyLlama, "--out", out(), "-j", "0"}, 2, "-j must be at least 1"},
		"-j not a number":               {[]string{"export", tinyLlama, "--out", out(), "-j", "x"}, 2, "invalid value"},
		"window size without layerwise": {[]string{"export", tinyLlama, "--out", out(), "--window-size", "2"}, 2, "need --layerwise"},
		"plugin dir missing":            {[]string{"--plugin-dir", "/nonexistent/plugins", "archs"}, 2, "--plugin-dir /nonexistent/plugins"},
		"archs with an argument":        {[]string{"archs", "x"}, 2, "archs takes no arguments"},
		"compile, bad ctx-len":          {[]string{"compile", tinyLlama, "--out", out(), "--plugin-dir", llamaDir, "--dry-run", "--ctx-len", "0"}, 2, "--ctx-len must be given"},
		"compile, bad backend":          {[]string{"compile", tinyLlama, "--out", out(), "--plugin-dir", llamaDir, "--backend", "trt"}, 2, `unknown --backend "trt"`},
		"compile, qaic flags on ort":    {[]string{"compile", tinyLlama, "--out", out(), "--plugin-dir", llamaDir, "--backend", "ort", "--dry-run", "--mxfp6-matmul", "--ctx-len", "64"}, 2, "--dry-run, --ctx-len, --mxfp6-matmul: only for --backend qaic"},
		"compile, ort flags on qaic":    {[]string{"compile", tinyLlama, "--out", out(), "--plugin-dir", llamaDir, "--dry-run", "--ort-level", "all"}, 2, "--ort-level: only for --backend ort"},
		"compile, no compiler":          {[]string{"compile", tinyLlama, "--out", out(), "--plugin-dir", llamaDir, "--compiler", "/nonexistent/qaic-compile"}, 2, "--compiler /nonexistent/qaic-compile"},
		"compile, no python":            {[]string{"compile", tinyLlama, "--out", out(), "--plugin-dir", llamaDir, "--backend", "ort", "--python", "/nonexistent/python"}, 2, "--python /nonexistent/python"},
		"missing checkpoint":            {[]string{"export", "/nonexistent/model", "--out", out(), "--plugin-dir", llamaDir}, 1, "/nonexistent/model"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, stdout, errOut := strata(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d (want %d), stderr:\n%s\nwant it to mention %q", code, tc.code, errOut, tc.want)
			}
			if strings.Contains(stdout, "USAGE:") {
				t.Errorf("a usage error dumps the help:\n%s", stdout)
			}
			// Flags are checked before any work: nothing was exported.
			for i, a := range tc.args {
				if a == "--out" && fileExists(tc.args[i+1]) && code == 2 {
					t.Errorf("%s was created before the usage error", tc.args[i+1])
				}
			}
		})
	}
}

// argv is a command line, for cases whose first word is a flag.
func argv(a ...string) []string { return a }

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := strata(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		for _, want := range []string{"strata " + version, runtime.Version(), "plugin protocol 1"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v lacks %q:\n%s", args, want, out)
			}
		}
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	code, main, _ := strata(t, "--help")
	if code != 0 {
		t.Fatal(code)
	}
	for _, want := range []string{"ENVIRONMENT:", "STRATA_PLUGIN_PATH", "XDG_CONFIG_HOME", "HF_HUB_CACHE", "HF_HOME", "EXIT STATUS:", "2 usage error", "version"} {
		if !strings.Contains(main, want) {
			t.Errorf("strata --help lacks %q", want)
		}
	}
	for _, cmd := range []string{"archs", "inspect", "export", "compile", "convert-bin", "version"} {
		t.Run(cmd, func(t *testing.T) {
			code, out, errOut := strata(t, cmd, "--help", "--plugin-dir", qwenDir)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if !strings.Contains(out, "EXAMPLES:\n   strata "+cmd) && !(cmd == "version" && strings.Contains(out, "EXAMPLES:")) {
				t.Errorf("no examples:\n%s", out)
			}
			if strings.Contains(out, "(default: false)") {
				t.Errorf("boolean flags say (default: false):\n%s", out)
			}
			if cmd == "export" && !regexp.MustCompile(`--moe-strategy gather\|dense`).MatchString(out) {
				t.Errorf("export --help lacks the plugins' options:\n%s", out)
			}
		})
	}
}

// A file named like a plugin that cannot run is reported, not skipped in
// silence.
func TestNonExecutablePluginReported(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "strata-plugin-broken")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := strata(t, "archs", "--plugin-dir", dir, "--plugin-dir", llamaDir)
	if code != 0 || !strings.Contains(out, bad) || !strings.Contains(out, "not executable") {
		t.Errorf("archs does not report %s: exit %d\n%s", bad, code, out)
	}
	code, _, errOut := strata(t, "inspect", tinyLlama, "--plugin-dir", dir, "--plugin-dir", llamaDir)
	if code != 0 || !strings.Contains(errOut, "warning: "+bad+": named like a plugin but not executable") {
		t.Errorf("inspect does not warn about %s: exit %d\n%s", bad, code, errOut)
	}
}

// compile.sh runs from any working directory, after its directory moved
// with the export inside it, and with STRATA_MODEL when moved away from an
// export outside it.
func TestCompileScriptMoves(t *testing.T) {
	t.Parallel()
	compiler := fakeCompiler(t)
	tmp := t.TempDir()
	inside := filepath.Join(tmp, "inside")
	if code, _, errOut := strata(t, "compile", tinyLlama, "--out", inside, "--plugin-dir", llamaDir, "--dry-run"); code != 0 {
		t.Fatal(errOut)
	}
	exported := filepath.Join(tmp, "whole")
	if code, _, errOut := strata(t, "export", tinyLlama, "--out", exported, "--plugin-dir", llamaDir); code != 0 {
		t.Fatal(errOut)
	}
	outside := filepath.Join(tmp, "outside")
	if code, _, errOut := strata(t, "compile", exported, "--out", outside, "--dry-run"); code != 0 {
		t.Fatal(errOut)
	}
	for _, dir := range []string{inside, outside} {
		if data := string(read(t, filepath.Join(dir, "compile.sh"))); strings.Contains(data, tmp) {
			t.Errorf("compile.sh holds a path of this machine:\n%s", data)
		}
	}
	moved := filepath.Join(tmp, "elsewhere", "deeper")
	os.MkdirAll(filepath.Dir(moved), 0o755)
	run := func(dir string, env ...string) (string, error) {
		cmd := exec.Command("sh", filepath.Join(dir, "compile.sh"))
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), append(env, "QAIC_COMPILE="+compiler)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if err := os.Rename(inside, moved); err != nil {
		t.Fatal(err)
	}
	if out, err := run(moved); err != nil || !fileExists(filepath.Join(moved, "qpc", "programqpc.bin")) {
		t.Errorf("moved with its export: %v\n%s", err, out)
	}
	movedOut := filepath.Join(tmp, "elsewhere", "outside")
	if err := os.Rename(outside, movedOut); err != nil {
		t.Fatal(err)
	}
	if out, err := run(movedOut); err == nil || !strings.Contains(out, "set STRATA_MODEL") {
		t.Errorf("moved away from its export: want a clear failure, got %v\n%s", err, out)
	}
	if out, err := run(movedOut, "STRATA_MODEL="+filepath.Join(exported, "model.onnx")); err != nil || !fileExists(filepath.Join(movedOut, "qpc", "programqpc.bin")) {
		t.Errorf("with STRATA_MODEL: %v\n%s", err, out)
	}
	args := string(read(t, filepath.Join(movedOut, "qpc", "args.txt")))
	if !strings.Contains(args, "-m="+filepath.Join(exported, "model.onnx")) {
		t.Errorf("compiler got:\n%s", args)
	}
}
