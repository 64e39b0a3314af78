//go:build !linux

package plugins

import (
	"os/exec"
	"syscall"
)

// dieWithHost has no kernel help outside Linux; the SDK's parent watchdog
// ends orphaned plugins there. The plugin still gets a process group of
// its own (see killGroup).
func dieWithHost(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
