package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/urfave/cli/v2"
)

// Profiling flags: the host's side of an export (plugins are separate
// processes; profile them with their own tests' benchmarks).
func profileFlags() []cli.Flag {
	return []cli.Flag{
		&cli.PathFlag{Name: "cpuprofile", Usage: "write a pprof CPU profile of the command to `FILE`"},
		&cli.PathFlag{Name: "memprofile", Usage: "write a pprof heap profile (allocations) at the end of the command to `FILE`"},
	}
}

const profilesKey = "profiles"

// startProfiles starts the CPU profile; stopProfiles ends it and writes the
// heap profile.
func startProfiles(c *cli.Context) error {
	stopCPU := func() error { return nil }
	if path := c.Path("cpuprofile"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		stopCPU = func() error { pprof.StopCPUProfile(); return f.Close() }
	}
	c.App.Metadata[profilesKey] = stopCPU
	return nil
}

func stopProfiles(c *cli.Context) error {
	if stopCPU, ok := c.App.Metadata[profilesKey].(func() error); ok {
		if err := stopCPU(); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
	}
	if path := c.Path("memprofile"); path != "" {
		if err := writeHeapProfile(path); err != nil {
			return fmt.Errorf("--memprofile: %w", err)
		}
	}
	return nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
