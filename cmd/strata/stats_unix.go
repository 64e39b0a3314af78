//go:build unix

package main

import (
	"runtime"
	"syscall"

	"github.com/strata-llm/strata/internal/procstat"
)

// processUsage is getrusage for this process and its waited-for children.
// The host's peak RSS comes from procfs where there is one: ru_maxrss
// includes the parent's RSS at spawn (see internal/procstat).
func processUsage() (self, children usage) {
	self, children = rusage(syscall.RUSAGE_SELF), rusage(syscall.RUSAGE_CHILDREN)
	if rss, ok := procstat.PeakRSS(0); ok {
		self.PeakRSSBytes = rss
	}
	return self, children
}

func rusage(who int) usage {
	var r syscall.Rusage
	if err := syscall.Getrusage(who, &r); err != nil {
		return usage{}
	}
	rss := r.Maxrss * 1024 // kilobytes on Linux
	if runtime.GOOS == "darwin" {
		rss = r.Maxrss // bytes on macOS
	}
	return usage{
		UserSeconds:   float64(r.Utime.Nano()) / 1e9,
		SystemSeconds: float64(r.Stime.Nano()) / 1e9,
		PeakRSSBytes:  rss,
	}
}
