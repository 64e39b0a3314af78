// Package contain runs a child process (a plugin, a compiler, ONNX
// Runtime's Python) so that it and everything it starts end with strata,
// even when strata itself is killed by SIGKILL and has no chance to act.
//
// On Linux the child runs under a shim: this same executable, started
// again with a marker argument (Main). The shim is a child subreaper, so
// every process below it that is orphaned (one started in a session of its
// own, or a double fork) becomes its child rather than init's; it gets
// SIGTERM when strata dies (the kernel's parent-death signal), and on that
// signal, or when its child exits, it kills every process left below it.
// Only a process that leaves the shim's subtree by other means (asking
// another daemon, such as systemd or an ssh server, to start it) escapes.
// Elsewhere, or in an executable whose main does not call Main, the child
// runs directly: in a process group of its own, killed with it (see Stop).
package contain

import (
	"context"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/strata-llm/strata/internal/procstat"
)

// marker is the argument that makes this executable a shim: it follows
// argv[0] (the child's path), then come the child's arguments.
const marker = "__strata-contain"

// enabled says Main was called: this executable can act as a shim.
var enabled atomic.Bool

// Main runs the shim and exits when this process was started as one;
// otherwise it records that the executable can be one. Call it first thing
// in main (and in a TestMain whose tests start contained processes).
func Main() {
	if len(os.Args) >= 2 && os.Args[1] == marker {
		os.Exit(shim(os.Args[0], os.Args[2:]))
	}
	enabled.Store(true)
}

// Command is exec.Command(name, args...) run contained. Its SysProcAttr is
// set: the caller must not replace it. In ps and /proc the shim's command
// line starts with name, as the child's does.
func Command(name string, args ...string) *exec.Cmd {
	exe, ok := shimPath()
	if !ok {
		cmd := exec.Command(name, args...)
		cmd.SysProcAttr = direct()
		return cmd
	}
	cmd := exec.Command(exe)
	cmd.Args = append([]string{name, marker}, args...)
	cmd.SysProcAttr = shimmed()
	return cmd
}

// WaitDelay bounds how long Wait waits, after the child exits or is
// stopped, for a process it left behind to let go of its output pipes.
const WaitDelay = 2 * time.Second

// CommandContext is Command stopped (with what it started) when ctx is
// done, its Wait bounded by WaitDelay.
func CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := Command(name, args...)
	ctxCmd := exec.CommandContext(ctx, cmd.Path)
	ctxCmd.Args, ctxCmd.SysProcAttr = cmd.Args, cmd.SysProcAttr
	ctxCmd.Cancel = func() error { Stop(ctxCmd); return nil }
	ctxCmd.WaitDelay = WaitDelay
	return ctxCmd
}

// Contained reports whether cmd runs under a shim.
func Contained(cmd *exec.Cmd) bool {
	return len(cmd.Args) >= 2 && cmd.Args[1] == marker
}

// Stop ends cmd's process and everything below it: a shim is asked with
// SIGTERM (it kills its whole subtree, orphans included, then exits) and
// given a second; then the process group and every descendant found are
// killed.
func Stop(cmd *exec.Cmd) {
	p := cmd.Process
	if p == nil || p.Pid <= 0 {
		return
	}
	below := procstat.Descendants(p.Pid)
	if Contained(cmd) {
		p.Signal(syscall.SIGTERM)
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline) && len(procstat.Descendants(p.Pid)) > 0; {
			time.Sleep(10 * time.Millisecond)
		}
	}
	syscall.Kill(-p.Pid, syscall.SIGKILL)
	for _, d := range below {
		d.Kill()
	}
}
