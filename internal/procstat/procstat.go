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
	"syscall"
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

// Proc is a process as procfs shows it: its pid, its parent's, and when it
// started (clock ticks after boot), which tells it from a later process
// given the same pid.
type Proc struct {
	Pid, PPid int
	Start     string
}

// stat reads process pid's parent and start time.
func stat(pid int) (Proc, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Proc{}, false
	}
	// pid (comm) state ppid ... starttime (field 22): comm may hold spaces
	// and parentheses.
	i := strings.LastIndex(string(data), ") ")
	if i < 0 {
		return Proc{}, false
	}
	f := strings.Fields(string(data)[i+2:])
	if len(f) < 20 {
		return Proc{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return Proc{}, false
	}
	return Proc{Pid: pid, PPid: ppid, Start: f[19]}, true
}

// all lists every process procfs shows (none where there is no procfs).
func all() []Proc {
	entries, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			if p, ok := stat(pid); ok {
				out = append(out, p)
			}
		}
	}
	return out
}

// Child is the pid of a child of process parent started as argv0 (its
// command line's first word), or 0 where procfs shows none (or is absent).
func Child(parent int, argv0 string) int {
	for _, p := range all() {
		if p.PPid != parent {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid))
		if first, _, _ := strings.Cut(string(cmdline), "\x00"); err == nil && first == argv0 {
			return p.Pid
		}
	}
	return 0
}

// Descendants are the processes below pid (its children, theirs, ...),
// whatever session or process group they moved to. None for a pid that is
// not one (0 would be every process: the kernel's threads' parent).
func Descendants(pid int) []Proc {
	if pid <= 0 {
		return nil
	}
	children := map[int][]Proc{}
	for _, p := range all() {
		children[p.PPid] = append(children[p.PPid], p)
	}
	var out []Proc
	queue := []int{pid}
	for len(queue) > 0 {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.Pid)
		}
		queue = queue[1:]
	}
	return out
}

// Kill sends SIGKILL to p if it still is that process (same start time):
// never to a later one that got its pid.
func (p Proc) Kill() {
	if now, ok := stat(p.Pid); ok && now.Start == p.Start {
		syscall.Kill(p.Pid, syscall.SIGKILL)
	}
}
