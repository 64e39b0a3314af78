package contain

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strata-llm/strata/internal/procstat"
	"github.com/strata-llm/strata/sdk"
)

func shimPath() (string, bool) {
	if !enabled.Load() {
		return "", false
	}
	exe, err := os.Executable()
	return exe, err == nil
}

// direct runs a child in a process group of its own (so that Stop reaches
// what it starts), killed by the kernel if strata dies.
func direct() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// shimmed gives the shim SIGTERM, which it handles, when strata dies.
func shimmed() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
}

// shim runs path with args as its child and returns its exit status; when
// the child exits, or the shim is told to stop (SIGTERM, SIGINT, SIGHUP:
// strata stops it, or died), every process below the shim is killed first.
func shim(path string, args []string) int {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "strata: cannot contain %s: %v\n", path, err)
		return 126
	}
	cmd := exec.Command(path, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = hostIsShim(os.Environ())
	// The shim killed by SIGKILL takes its child with it; the child stays
	// in the shim's process group, which the host kills too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 127 // as a shell says a command it cannot run
	}
	exited := make(chan int, 1)
	go func() {
		cmd.Wait()
		exited <- exitStatus(cmd.ProcessState)
	}()
	code := 0
	select {
	case code = <-exited:
	case sig := <-stop:
		code = 128 + int(sig.(syscall.Signal))
	}
	killBelow()
	return code
}

// hostIsShim names the shim as a strata plugin's host: the SDK ends a
// plugin whose parent is no longer its host, and the shim is its parent.
func hostIsShim(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, sdk.HostPIDEnv+"=") {
			out = append(out, kv)
		}
	}
	if len(out) < len(env) {
		out = append(out, sdk.HostPIDEnv+"="+strconv.Itoa(os.Getpid()))
	}
	return out
}

func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// killBelow kills every process below the shim and reaps them, again
// until none is left: one may fork while its siblings die, and orphans
// reach the shim (a subreaper) only once their parent is gone.
func killBelow() {
	self := os.Getpid()
	for range 500 { // 5 s at most: a fork bomb is not contained for ever
		below := procstat.Descendants(self)
		for _, p := range below {
			p.Kill()
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
		if len(below) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
