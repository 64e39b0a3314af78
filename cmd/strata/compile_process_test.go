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
			if left := temps(out); len(left) > 0 {
				t.Errorf("the killed run's temporary directories are still there: %v", left)
			}
		})
	}
}
