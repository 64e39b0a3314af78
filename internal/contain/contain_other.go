//go:build !linux

package contain

import "syscall"

// No shim outside Linux: there is no subreaper or parent-death signal.
func shimPath() (string, bool) { return "", false }

func direct() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func shimmed() *syscall.SysProcAttr { return direct() }

func shim(string, []string) int { return 126 }
