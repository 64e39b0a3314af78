package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Compile's processes (issue 30): the compiler and ONNX Runtime's Python
// end with strata (Ctrl-C, SIGKILL), and so does whatever they started; a
// child left holding their output is not waited for.

// script writes an executable shell script into dir.
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	must(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755))
	return path
}

// childScript starts two sleepers below the script, one in its process
// group holding its stdout and stderr, one in a session of its own, their
// pids in dir/child.pid and dir/setsid.pid.
func childScript(dir string) string {
	return "sleep 60 & echo $! > " + dir + "/child.pid\n" +
		"setsid sleep 60 > /dev/null 2>&1 < /dev/null & echo $! > " + dir + "/setsid.pid\n"
}

// children are the pids childScript recorded, once both are there.
func children(t *testing.T, dir string) []int {
	t.Helper()
	var pids []int
	for _, name := range []string{"child.pid", "setsid.pid"} {
		var pid int
		waitFor(t, func() bool {
			data, err := os.ReadFile(filepath.Join(dir, name))
			n, serr := strconv.Atoi(strings.TrimSpace(string(data)))
			pid = n
			return err == nil && serr == nil && pid > 0
		})
		pids = append(pids, pid)
	}
	return pids
}

// compiledExport is a fresh export of the tiny Llama to compile.
func compiledExport(t *testing.T) string {
	t.Helper()
	exp := filepath.Join(t.TempDir(), "export")
	if code, _, stderr := strata(t, "export", tinyLlama, "--out", exp, "--plugin-dir", llamaDir); code != 0 {
		t.Fatal(stderr)
	}
	return exp
}

// makeQPC is the part of a fake compiler that makes its binary directory.
const makeQPC = `for a in "$@"; do case "$a" in -aic-binary-dir=*) d="${a#-aic-binary-dir=}"; mkdir -p "$d"; echo qpc > "$d/programqpc.bin";; esac; done
`

func TestCompileProcessesEndWithStrata(t *testing.T) {
	t.Parallel()
	exp := compiledExport(t)
	for _, tc := range []struct {
		name string
		// compiler is the fake compiler's body (after childScript);
		// python, when set, makes the case run --backend ort with it.
		compiler, python string
		signal           syscall.Signal // 0: strata runs to its end
		code             int
		limit            time.Duration // from the signal (or start) to strata's exit
	}{
		{name: "a child holding the compiler's output after it exits", compiler: makeQPC + "exit 0\n", code: 0, limit: 10 * time.Second},
		{name: "Ctrl-C while the compiler runs", compiler: makeQPC + "sleep 60\n", signal: syscall.SIGINT, code: 130, limit: 2 * time.Second},
		{name: "SIGTERM while the compiler runs", compiler: makeQPC + "sleep 60\n", signal: syscall.SIGTERM, code: 130, limit: 2 * time.Second},
		{name: "SIGKILL while the compiler runs", compiler: makeQPC + "while true; do date >> \"$d/log\"; sleep 0.05; done\n", signal: syscall.SIGKILL, code: -1, limit: time.Second},
		{name: "Ctrl-C while --python runs", python: "case \"$2\" in 'import onnxruntime') exit 0;; esac\n", signal: syscall.SIGINT, code: 130, limit: 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			out := filepath.Join(t.TempDir(), "compiled")
			args := []string{"compile", exp, "--out", out}
			if tc.python != "" {
				python := script(t, dir, "python", tc.python+childScript(dir)+"sleep 60\n")
				args = append(args, "--backend", "ort", "--python", python)
			} else {
				args = append(args, "--compiler", script(t, dir, "qaic-compile", childScript(dir)+tc.compiler))
			}
			cmd := exec.Command(strataBin, args...)
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stderr, &stderr
			cmd.WaitDelay = 5 * time.Second // a survivor holding the pipes fails the case, not the run
			start := time.Now()
			must(t, cmd.Start())
			defer cmd.Process.Kill()
			pids := children(t, dir)
			if tc.signal != 0 {
				time.Sleep(200 * time.Millisecond)
				start = time.Now()
				must(t, cmd.Process.Signal(tc.signal))
			}
			cmd.Wait()
			if took := time.Since(start); took > tc.limit {
				t.Errorf("strata took %s to exit, more than %s", took, tc.limit)
			}
			if code := cmd.ProcessState.ExitCode(); code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, stderr.String())
			}
			for _, pid := range pids {
				requireDead(t, pid, "the compiler's child")
			}
			requireNoProcesses(t, dir) // the fake compiler or python itself
			if tc.code == 0 {
				if !fileExists(filepath.Join(out, "qpc", "programqpc.bin")) {
					t.Error("no qpc")
				}
				return
			}
			if fileExists(filepath.Join(out, "qpc")) || fileExists(filepath.Join(out, "model.optimized.onnx")) {
				t.Error("an interrupted compile left its output")
			}
			if tc.signal != syscall.SIGKILL {
				if left := temps(out); len(left) > 0 {
					t.Errorf("temporary directories left: %v", left)
				}
				return
			}
			if len(temps(out)) == 0 {
				t.Fatal("SIGKILL left no temporary directory: the case tests nothing")
			}
			// Nothing writes into the killed run's temporary directory
			// any more, and the next run removes it.
			time.Sleep(200 * time.Millisecond)
			if code, _, errOut := strata(t, "compile", exp, "--out", out, "--dry-run"); code != 0 {
				t.Fatalf("the run after SIGKILL: %s", errOut)
			}
			time.Sleep(200 * time.Millisecond) // a surviving compiler would write again
			if left := temps(out); len(left) > 0 {
				t.Errorf("the killed run's temporary directories are still there: %v", left)
			}
		})
	}
}

// A compiler or Python that cannot be used is the invocation's fault:
// exit 2, as docs/compile.md says, before anything is exported.
func TestCompileToolsMissingExitTwo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable")
	must(t, os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644))
	noORT := script(t, dir, "python-without-ort", "echo \"ModuleNotFoundError: No module named 'onnxruntime'\" >&2; exit 1\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"compiler is a directory", []string{"--compiler", dir}, "a directory, not the compiler"},
		{"compiler is not executable", []string{"--compiler", notExec}, "not executable"},
		{"compiler is missing", []string{"--compiler", filepath.Join(dir, "nothing")}, "--compiler " + filepath.Join(dir, "nothing")},
		{"--python cannot import onnxruntime", []string{"--backend", "ort", "--python", noORT}, "No module named 'onnxruntime'"},
		{"--python is missing", []string{"--backend", "ort", "--python", filepath.Join(dir, "nothing")}, "--python " + filepath.Join(dir, "nothing")},
		{"unknown --ort-level", []string{"--backend", "ort", "--ort-level", "max"}, `unknown --ort-level "max"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "compiled")
			code, _, stderr := strata(t, append([]string{"compile", tinyLlama, "--out", out, "--plugin-dir", llamaDir}, tc.args...)...)
			if code != 2 || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, want 2 saying %q:\n%s", code, tc.want, stderr)
			}
			if _, err := os.Lstat(out); !os.IsNotExist(err) {
				t.Errorf("a refused compile left %s (%v)", out, err)
			}
		})
	}
}

// The export and --out may each be relative or absolute (issue 30: a mix
// failed with "Rel: can't make ... relative to ..."); the compiler gets the
// model relative to --out, and compile.sh replays from anywhere.
func TestCompileRelativeAndAbsolutePaths(t *testing.T) {
	t.Parallel()
	compiler := fakeCompiler(t)
	for _, tc := range []struct{ name, src, out string }{
		{"both relative", "exp", "out"},
		{"absolute export, relative --out", "ABS/exp", "out"},
		{"relative export, absolute --out", "exp", "ABS/out"},
		{"both absolute", "ABS/exp", "ABS/out"},
		{"relative --out below a symlink", "exp", "alias/out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cwd := t.TempDir()
			abs := func(p string) string { return strings.Replace(p, "ABS", cwd, 1) }
			if code, _, stderr := strata(t, "export", tinyLlama, "--out", filepath.Join(cwd, "exp"), "--plugin-dir", llamaDir); code != 0 {
				t.Fatal(stderr)
			}
			must(t, os.Mkdir(filepath.Join(cwd, "elsewhere"), 0o755))
			must(t, os.Symlink(filepath.Join(cwd, "elsewhere"), filepath.Join(cwd, "alias")))
			cmd := exec.Command(strataBin, "compile", abs(tc.src), "--out", abs(tc.out), "--compiler", compiler)
			cmd.Dir = cwd
			if msg, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v:\n%s", err, msg)
			}
			outDir := filepath.Join(cwd, strings.TrimPrefix(abs(tc.out), cwd+"/"))
			args := string(read(t, filepath.Join(outDir, "qpc", "args.txt")))
			want := "-m=../exp/model.onnx"
			if strings.HasPrefix(tc.out, "alias") {
				want = "-m=../../exp/model.onnx" // from elsewhere/out, where the compiler runs
			}
			if !strings.Contains(args, want+"\n") {
				t.Errorf("the compiler got\n%s\nwant %s", args, want)
			}
			replay := exec.Command("sh", filepath.Join(outDir, "compile.sh"))
			replay.Env = append(os.Environ(), "QAIC_COMPILE="+compiler)
			replay.Dir = t.TempDir()
			if msg, err := replay.CombinedOutput(); err != nil {
				t.Errorf("compile.sh from elsewhere: %v:\n%s", err, msg)
			}
		})
	}
}
