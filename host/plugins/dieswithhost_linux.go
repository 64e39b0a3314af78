package plugins

import (
	"os/exec"
	"syscall"
)

// dieWithHost asks the kernel to kill the plugin when the host dies, even by
// SIGKILL, and starts it in a process group of its own, so that stopping it
// stops whatever it started too (see killGroup). (The SDK also exits a
// plugin whose parent is gone, for systems without this.)
func dieWithHost(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
