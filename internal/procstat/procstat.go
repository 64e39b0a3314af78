// Package procstat reads a process's peak resident set size from procfs.
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
