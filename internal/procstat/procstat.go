// Package procstat reads from procfs a process's peak resident set size,
// and finds a child process by how it was started.
//
// getrusage's ru_maxrss is no good for this on Linux: a child started by
// fork/exec (Go's os/exec uses vfork) inherits its parent's high-water
// mark, so every child looks at least as big as its parent was at spawn.
// VmHWM in /proc/<pid>/status belongs to the process's own address space.
package procstat

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// PeakRSS is the peak resident set size in bytes of process pid (0: this
// process), and false where procfs does not say (not Linux, or gone).
func PeakRSS(pid int) (int64, bool) {
	path := "/proc/self/status"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}

// Child is the pid of a child of process parent started as argv0 (its
// command line's first word), or 0 where procfs shows none (or is absent).
func Child(parent int, argv0 string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndex(string(stat), ") ")
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat)[i+2:])
		if len(fields) < 2 || fields[1] != strconv.Itoa(parent) {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if first, _, _ := strings.Cut(string(cmdline), "\x00"); err == nil && first == argv0 {
			return pid
		}
	}
	return 0
}
