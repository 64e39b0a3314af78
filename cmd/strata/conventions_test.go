package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
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

// A command whose stdout cannot be written (a closed pipe, a full disk)
// fails, saying so on stderr, instead of exiting 0 with its output lost.
func TestUnwritableStdoutFails(t *testing.T) {
	t.Parallel()
	exported := filepath.Join(t.TempDir(), "exported")
	if code, _, stderr := strata(t, "export", tinyLlama, "--out", exported, "--plugin-dir", llamaDir); code != 0 {
		t.Fatalf("export: %s", stderr)
	}
	commands := map[string][]string{
		"archs --json":   {"archs", "--json"},
		"inspect --json": {"inspect", tinyLlama, "--json"},
		"export --json":  {"export", tinyLlama, "--json", "--out"}, // --out DIR added
		"convert --json": {"convert", tinyLlama, "--json", "--out"},
		"compile --json": {"compile", tinyLlama, "--dry-run", "--json", "--out"},
		"check --json":   {"check", exported, "--json"},
		"check":          {"check", exported},
		"archs":          {"archs"},
		"version":        {"version"},
		"help":           {"--help"},
	}
	sinks := map[string]func(t *testing.T) *os.File{
		"/dev/full": func(t *testing.T) *os.File {
			f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
			if err != nil {
				t.Skip(err)
			}
			return f
		},
		"closed pipe": func(t *testing.T) *os.File {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			r.Close()
			return w
		},
	}
	for name, args := range commands {
		for sink, open := range sinks {
			t.Run(name+" > "+sink, func(t *testing.T) {
				t.Parallel()
				argv := append(slices.Clone(args), filepath.Join(t.TempDir(), "out"), "--plugin-dir", llamaDir)
				if args[len(args)-1] != "--out" {
					argv = append(slices.Clone(args), "--plugin-dir", llamaDir)
				}
				stdout := open(t)
				defer stdout.Close()
				cmd := exec.Command(strataBin, argv...)
				var stderr strings.Builder
				cmd.Stdout, cmd.Stderr = stdout, &stderr
				err := cmd.Run()
				code := cmd.ProcessState.ExitCode()
				if code != 1 || !strings.Contains(stderr.String(), "writing the output to stdout") {
					t.Errorf("exit %d (%v), want 1 and a message; stderr:\n%s", code, err, stderr.String())
				}
			})
		}
	}
}

// A boolean plugin option works bare, as a boolean flag: --vision is
// --vision true, and implies vision.onnx as --mtp draft implies mtp.onnx;
// an option with other values written bare is refused, naming them.
func TestBarePluginOptions(t *testing.T) {
	t.Parallel()
	plugins := t.TempDir()
	if _, err := testbin.Build(plugins, "strata-plugin-qwen3vl", "./cmd/strata-plugin-qwen3vl"); err != nil {
		t.Fatal(err)
	}
	fixture := filepath.Join(testbin.Root(), "conformance", "fixtures", "qwen3vl-f32-dense-vision", "model")
	inputs := func(path string) []string {
		var names []string
		for _, in := range readModel(t, path).GetGraph().GetInput() {
			names = append(names, in.GetName())
		}
		return names
	}
	var want []string // model.onnx's inputs with --vision true --extra-model vision
	for i, args := range [][]string{
		{"--vision", "true", "--extra-model", "vision"},
		{"--vision"},
		{"--plugin-option", "vision"},
		{"--vision", fixture}, // MODEL after the bare option
	} {
		out := filepath.Join(t.TempDir(), "out")
		argv := append([]string{"export", fixture, "--out", out, "--plugin-dir", plugins}, args...)
		if args[len(args)-1] == fixture {
			argv = append([]string{"export", "--out", out, "--plugin-dir", plugins}, args...)
		}
		code, _, stderr := strata(t, argv...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		got := inputs(filepath.Join(out, "model.onnx"))
		if i == 0 {
			want = got
		}
		if !slices.Contains(got, "vision_embeds") || !slices.Equal(got, want) {
			t.Errorf("%v: model.onnx inputs %v, want %v", args, got, want)
		}
		if !fileExists(filepath.Join(out, "vision.onnx")) {
			t.Errorf("%v: no vision.onnx", args)
		}
	}
	// Without the option: text only, no vision.onnx.
	out := filepath.Join(t.TempDir(), "out")
	if code, _, stderr := strata(t, "export", fixture, "--out", out, "--plugin-dir", plugins); code != 0 || fileExists(filepath.Join(out, "vision.onnx")) {
		t.Errorf("no --vision: exit %d, vision.onnx written %v: %s", code, fileExists(filepath.Join(out, "vision.onnx")), stderr)
	}
	// Not boolean: a value is needed.
	out = filepath.Join(t.TempDir(), "out")
	code, _, stderr := strata(t, "export", fixture, "--out", out, "--plugin-dir", plugins, "--position-ids-rank")
	if code != 2 || !strings.Contains(stderr, "--position-ids-rank needs a value: one of 2, 3") || fileExists(out) {
		t.Errorf("bare --position-ids-rank: exit %d: %s", code, stderr)
	}
}

// docs/strata.1 is the man page the commands make now (go test -update,
// or make man, rewrites it).
func TestManPageIsCurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(testbin.Root(), "docs", "strata.1")
	strata(t, "help", "export") // see TestShellCompletion
	code, page, stderr := strata(t, "man")
	if code != 0 || !strings.Contains(page, ".TH strata 1") {
		t.Fatalf("strata man: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"export", "--revision", "EXIT STATUS", "HF_HUB_CACHE", "the number of CPUs"} {
		if !strings.Contains(page, want) {
			t.Errorf("the man page lacks %q", want)
		}
	}
	if *update {
		if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if committed, err := os.ReadFile(path); err != nil || string(committed) != page {
		t.Errorf("%s is not the page the commands make (%v): run make man (or go test ./cmd/strata -run TestManPageIsCurrent -update)", path, err)
	}
}

// strata completion prints a script per shell that the shell parses; the
// binary answers the scripts' requests with commands and flags.
func TestShellCompletion(t *testing.T) {
	t.Parallel()
	// urfave/cli's help command, once run, is its own subcommand: the
	// fish script and the man page must not walk it (in-process runs).
	strata(t, "help", "export")
	for _, shell := range []string{"bash", "zsh", "fish"} {
		code, script, stderr := strata(t, "completion", shell)
		if code != 0 || !strings.Contains(script, "strata") {
			t.Fatalf("completion %s: exit %d: %s", shell, code, stderr)
		}
		if _, err := exec.LookPath(shell); err != nil {
			continue // not installed: the syntax check needs the shell
		}
		if out, err := exec.Command(shell, "-n", "-c", script).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v\n%s", shell, err, out)
		}
	}
	if code, _, stderr := strata(t, "completion", "tcsh"); code != 2 || !strings.Contains(stderr, "bash, zsh or fish") {
		t.Errorf("completion tcsh: exit %d: %s", code, stderr)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{completeFlag}, []string{"export", "inspect", "completion"}},
		{[]string{"export", "--o", completeFlag}, []string{"--out", "--overwrite"}},
	} {
		out, err := exec.Command(strataBin, tc.args...).Output()
		for _, w := range tc.want {
			if err != nil || !slices.Contains(strings.Fields(string(out)), w) {
				t.Errorf("%v: %v, want %q among:\n%s", tc.args, err, w, out)
			}
		}
	}
	// bash, as it runs the script: the words completing "strata exp".
	if _, err := exec.LookPath("bash"); err == nil {
		code, script, _ := strata(t, "completion", "bash")
		probe := script + `COMP_WORDS=(strata exp); COMP_CWORD=1; _strata_complete; printf '%s\n' "${COMPREPLY[@]}"`
		cmd := exec.Command("bash", "-c", probe)
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(strataBin)+":"+os.Getenv("PATH"))
		out, err := cmd.Output()
		if code != 0 || err != nil || strings.TrimSpace(string(out)) != "export" {
			t.Errorf("bash completes strata exp to %q (%v)", out, err)
		}
	}
}
