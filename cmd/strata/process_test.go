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

	"github.com/strata-llm/strata/internal/testbin"
)

// alive reports whether pid runs (a zombie waiting for its reaper does not).
func alive(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// requireDead waits a little for pid to go, then fails if it runs.
func requireDead(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("%s (pid %d) outlived strata", what, pid)
	}
}

func childPid(t *testing.T, dir string) int {
	t.Helper()
	var pid int
	waitFor(t, func() bool {
		data, err := os.ReadFile(filepath.Join(dir, "child.pid"))
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(string(data))
		return err == nil
	})
	return pid
}

// A plugin lives in a process group of its own: a timeout, its exit, Ctrl-C
// or SIGTERM ends the whole group, including a child that keeps the
// plugin's stdout open (which used to hang strata past --plugin-timeout
// and be left orphaned).
func TestPluginProcessGroupEndsWithIt(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name   string
		mode   string
		signal syscall.Signal // 0: strata runs in-process until it fails
		want   string
		code   int
	}{
		{"timeout with a child holding stdout", "child-hang", 0, "did not answer within 2s", 1},
		{"plugin exits with a child holding stdout", "child-exit", 0, "strata-plugin-fake-child-exit", 1},
		{"SIGTERM", "child-hang", syscall.SIGTERM, "interrupted", 130},
		{"Ctrl-C", "child-hang", syscall.SIGINT, "interrupted", 130},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dirs, err := testbin.FakePlugins(t.TempDir(), tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			dir := dirs[tc.mode]
			out := filepath.Join(t.TempDir(), "out")
			args := []string{"--plugin-timeout", timeout.String(), "export", tinyLlama, "--out", out, "--plugin-dir", dir}
			start := time.Now()
			var code int
			var errOut string
			if tc.signal == 0 {
				// A process of its own: in-process runs take turns
				// (inProcess), and the wait would count as strata's time.
				cmd := exec.Command(strataBin, args...)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				cmd.Run()
				code, errOut = cmd.ProcessState.ExitCode(), stderr.String()
			} else {
				cmd := exec.Command(strataBin, args...)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				childPid(t, dir)
				time.Sleep(300 * time.Millisecond) // let the host reach Plan
				start = time.Now()
				cmd.Process.Signal(tc.signal)
				cmd.Wait()
				code, errOut = cmd.ProcessState.ExitCode(), stderr.String()
			}
			took := time.Since(start)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, errOut)
			}
			// The timeout, then go-plugin's 2 s of grace and the group's kill.
			if limit := timeout + 4*time.Second; took > limit {
				t.Errorf("strata took %s to give up, more than %s", took, limit)
			}
			requireDead(t, childPid(t, dir), "the plugin's child")
			requireNoProcesses(t, dir)
			if _, err := os.Stat(filepath.Join(out, "model.onnx")); err == nil {
				t.Error("model.onnx written")
			}
		})
	}
}

// A plugin's child that left the plugin's process group for a session of
// its own still ends with the plugin (issue 30: it survived strata's exit).
func TestPluginChildInASessionOfItsOwnEndsWithIt(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"archs"}, {"export", tinyLlama, "--out", filepath.Join(t.TempDir(), "out")}} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			dirs, err := testbin.FakePlugins(t.TempDir(), "child-setsid")
			if err != nil {
				t.Fatal(err)
			}
			dir := dirs["child-setsid"]
			cmd := exec.Command(strataBin, append(args, "--plugin-dir", dir)...)
			cmd.Run()
			requireDead(t, childPid(t, dir), "the plugin's child in a session of its own")
			requireNoProcesses(t, dir)
		})
	}
}

// A plugin's children, in its process group or in a session of their own,
// end when strata is killed by SIGKILL (issue 30): the plugin runs under a
// shim that is a child subreaper and kills everything below it when strata
// dies (internal/contain).
func TestPluginChildrenEndWithStrataKilled(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"child-hang", "child-setsid-hang"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dirs, err := testbin.FakePlugins(t.TempDir(), mode)
			must(t, err)
			dir := dirs[mode]
			cmd := exec.Command(strataBin, "export", tinyLlama, "--out", filepath.Join(t.TempDir(), "out"), "--plugin-dir", dir)
			must(t, cmd.Start())
			child := childPid(t, dir)
			time.Sleep(300 * time.Millisecond) // let the host reach Plan
			must(t, cmd.Process.Kill())
			cmd.Wait()
			requireDead(t, child, "the plugin's child")
			requireNoProcesses(t, dir)
		})
	}
}

// An export starts only the plugin it needs (issue 30: it waited 45 s and
// more for an unrelated plugin that never answered Describe): the others
// are known from the describe cache, a plugin after the one that handles
// the model is not waited for, one that failed to describe itself is
// remembered until its binary changes, and a changed binary or a damaged
// cache is described again.
func TestDiscoveryStartsOnlyWhatItNeeds(t *testing.T) {
	t.Parallel()
	fakes, err := testbin.FakePlugins(t.TempDir(), "unrelated", "hang-on-describe")
	must(t, err)
	llama, unrelated, hang := ownPlugins(t, llamaDir), fakes["unrelated"], fakes["hang-on-describe"]
	cache := t.TempDir()
	const timeout = 3 * time.Second
	starts := func() int {
		data, _ := os.ReadFile(filepath.Join(unrelated, "starts"))
		return strings.Count(string(data), "\n")
	}
	run := func(command string, dirs ...string) time.Duration {
		t.Helper()
		args := []string{"--plugin-timeout", timeout.String(), command}
		if command == "export" {
			args = append(args, tinyLlama, "--out", filepath.Join(t.TempDir(), "out"))
		}
		for _, d := range dirs {
			args = append(args, "--plugin-dir", d)
		}
		cmd := exec.Command(strataBin, args...)
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cache)
		start := time.Now()
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v:\n%s", err, msg)
		}
		for _, d := range dirs {
			requireNoProcesses(t, d)
		}
		return time.Since(start)
	}
	// A plugin before llama must be described before llama is chosen: its
	// starts count deterministically.
	for _, step := range []struct {
		name    string
		before  func()
		command string
		dirs    []string
		starts  int  // more starts of the unrelated plugin; -1: any
		slow    bool // waits out --plugin-timeout (a hung plugin first met before llama)
	}{
		{name: "a hung plugin after llama, not waited for", command: "export", dirs: []string{llama, unrelated, hang}, starts: -1},
		{name: "archs describes every plugin", command: "archs", dirs: []string{llama, unrelated}, starts: 1},
		{name: "the unrelated plugin known from the cache", command: "export", dirs: []string{unrelated, llama, hang}},
		{name: "a hung plugin before llama, first met", command: "export", dirs: []string{hang, unrelated, llama}, slow: true},
		{name: "a hung plugin before llama, remembered", command: "export", dirs: []string{hang, unrelated, llama}},
		{name: "the unrelated plugin rebuilt", command: "export", dirs: []string{unrelated, llama}, starts: 1, before: func() {
			bin := filepath.Join(unrelated, "strata-plugin-fake-unrelated")
			data, err := os.ReadFile(bin)
			must(t, err)
			must(t, os.WriteFile(bin+".new", data, 0o755))
			must(t, os.Rename(bin+".new", bin))
		}},
		{name: "a damaged cache", command: "export", dirs: []string{unrelated, llama}, starts: 1, before: func() {
			entries, err := filepath.Glob(filepath.Join(cache, "strata", "plugins", "*.json"))
			must(t, err)
			if len(entries) == 0 {
				t.Fatal("no cache entry written")
			}
			for _, e := range entries {
				must(t, os.WriteFile(e, []byte("{\"key\": {\"path\": 1"), 0o644))
			}
		}},
	} {
		if step.before != nil {
			step.before()
		}
		before := starts()
		took := run(step.command, step.dirs...)
		if step.slow != (took >= timeout) {
			t.Errorf("%s: took %s (--plugin-timeout %s)", step.name, took, timeout)
		}
		if got := starts() - before; step.starts >= 0 && got != step.starts {
			t.Errorf("%s: the unrelated plugin started %d times, want %d", step.name, got, step.starts)
		}
	}
}
