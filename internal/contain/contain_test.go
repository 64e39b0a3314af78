package contain

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostEnv makes the test binary a host that runs $CONTAIN_SCRIPT contained
// and waits for it: the test kills that host.
const hostEnv = "CONTAIN_TEST_HOST"

func TestMain(m *testing.M) {
	Main()
	if script := os.Getenv(hostEnv); script != "" {
		cmd := Command("/bin/sh", "-c", script)
		cmd.Run()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// script starts, below the child, a sleeper in a session of its own and
// one in the child's group, each writing its pid to dir, then runs tail.
func script(dir, tail string) string {
	return "setsid sleep 60 & echo $! > " + dir + "/a; sleep 60 & echo $! > " + dir + "/b; " + tail
}

func pids(t *testing.T, dir string) []int {
	t.Helper()
	var out []int
	for _, name := range []string{"a", "b"} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			data, err := os.ReadFile(filepath.Join(dir, name))
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && perr == nil {
				out = append(out, pid)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no pid in %s", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return out
}

// gone reports whether pid has ended (a zombie has).
func gone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i+2 < len(s) && s[i+2] == 'Z'
}

func requireGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for !gone(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !gone(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("process %d outlived its container", pid)
		}
	}
}

func TestContained(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("containment is Linux only")
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, dir string) time.Duration // how long the host waited
	}{
		{"the child exits, a background child holding its stdout", func(t *testing.T, dir string) time.Duration {
			cmd := Command("/bin/sh", "-c", script(dir, "exit 3"))
			var out bytes.Buffer
			cmd.Stdout = &out // a pipe: Wait waits for every writer to close it
			start := time.Now()
			err := cmd.Run()
			if code := cmd.ProcessState.ExitCode(); code != 3 {
				t.Errorf("exit %d (%v), want the child's 3", code, err)
			}
			return time.Since(start)
		}},
		{"the context is cancelled", func(t *testing.T, dir string) time.Duration {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cmd := CommandContext(ctx, "/bin/sh", "-c", script(dir, "sleep 60"))
			cmd.Stdout = &bytes.Buffer{}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pids(t, dir)
			start := time.Now()
			cancel()
			cmd.Wait()
			return time.Since(start)
		}},
		{"the host is killed by SIGKILL", func(t *testing.T, dir string) time.Duration {
			exe, _ := os.Executable()
			host := exec.Command(exe)
			host.Env = append(os.Environ(), hostEnv+"="+script(dir, "sleep 60"))
			if err := host.Start(); err != nil {
				t.Fatal(err)
			}
			pids(t, dir)
			host.Process.Kill()
			host.Wait()
			return 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			took := tc.run(t, dir)
			if took > 3*time.Second {
				t.Errorf("the host waited %s", took)
			}
			requireGone(t, pids(t, dir))
		})
	}
}

// Without Main the executable is no shim: children run directly, in a
// process group of their own, killed with strata.
func TestDirectWithoutMain(t *testing.T) {
	enabled.Store(false)
	defer enabled.Store(true)
	cmd := Command("/bin/true")
	if Contained(cmd) || cmd.Path != "/bin/true" || !cmd.SysProcAttr.Setpgid {
		t.Errorf("without Main: %v contained=%v", cmd.Args, Contained(cmd))
	}
	if err := cmd.Run(); err != nil {
		t.Error(err)
	}
}
