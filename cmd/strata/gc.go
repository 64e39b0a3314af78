package main

import (
	"os"
	"runtime/debug"
)

// gcPercent is strata's garbage-collection target (GOGC). Most of an
// export's heap is what it keeps to the end — the checkpoint's index, the
// graph, the weight spec — so Go's default, collecting once the heap has
// doubled since the last collection, lets the peak reach twice the live
// data. Collecting at half again keeps the peak nearer what is live, for
// more collections (bench: make bench, the FP8 flagship rows).
const gcPercent = 50

// tuneGC sets gcPercent unless the user set GOGC.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
}

// A weight-free export bounds its heap by a soft limit instead: its live
// heap (20–60 MB, the checkpoint's index and the graph) is known to fit,
// so below the limit it collects rarely. Measured, header-only, host CPU
// and peak RSS: GLM-4.6-FP8 0.96 s and 97 MiB at GOGC=50, 0.84 s and
// 107 MiB with a 96 MiB limit; Kimi-K2 (139,583 tensors, ~60 MB live,
// where collecting is a third of the CPU) layerwise 0.93 s and 107 MiB
// with a 96 MiB limit, 0.89 s and 115 MiB with 104 MiB, 0.87 s and
// 123 MiB with 112 MiB (alternating runs): 104 MiB leaves the 128 MiB
// budget a margin.
const (
	exportGCPercent   = 200
	exportMemoryLimit = 104 << 20
)

// tuneExportGC applies the export's settings unless the user chose GOGC or
// GOMEMLIMIT. A live heap past the limit makes the collector work harder
// (Go caps it at half the CPU); it never fails the export. Materialising
// streams tensor data through the heap: it keeps gcPercent.
func tuneExportGC(materialize bool) {
	if materialize || os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetGCPercent(exportGCPercent)
	debug.SetMemoryLimit(exportMemoryLimit)
}
