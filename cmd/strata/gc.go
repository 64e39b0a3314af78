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
