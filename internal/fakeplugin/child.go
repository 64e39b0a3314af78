package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// childEnv marks the fake plugin's own child process.
const childEnv = "STRATA_FAKE_PLUGIN_CHILD"

// runChild is the child: it holds the plugin's stdout open and sleeps.
func runChild() bool {
	if os.Getenv(childEnv) == "" {
		return false
	}
	time.Sleep(10 * time.Minute)
	return true
}

// startChild starts a child that inherits the plugin's stdout (go-plugin's
// pipe to the host), or with setsid one in a session of its own that does
// not, and records its pid in child.pid beside the binary.
func startChild(setsid bool) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1")
	if setsid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.Stdout = os.Stdout
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "fake plugin: starting child:", err)
		os.Exit(1)
	}
	pidFile := filepath.Join(filepath.Dir(os.Args[0]), "child.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "fake plugin:", err)
		os.Exit(1)
	}
}

// recordStart appends this process's pid to starts beside the binary.
func recordStart() {
	f, err := os.OpenFile(filepath.Join(filepath.Dir(os.Args[0]), "starts"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		fmt.Fprintln(f, os.Getpid())
		err = f.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake plugin:", err)
		os.Exit(1)
	}
}
