package plugins

import "syscall"

// killGroup kills every process left in the plugin's process group (the
// plugin started with Setpgid, so the group's id is its pid): children it
// started, including one that keeps its stdout open.
func killGroup(pid int) {
	if pid > 0 {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
}
