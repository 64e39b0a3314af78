package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// BenchmarkMaterializePeakRSS exports, with --weights materialize, header-only
// Llama checkpoints of 8, 32 and 128 layers (hidden 512, vocab 32000: a
// 65 MB float32 embedding is the largest tensor) and reports the strata
// process's peak RSS. It should stay flat as layers grow: one weight is in
// memory at a time. Writes up to 1.7 GB; run with -benchtime=1x.
func BenchmarkMaterializePeakRSS(b *testing.B) {
	for _, layers := range []int{8, 32, 128} {
		b.Run(fmt.Sprintf("layers=%d", layers), func(b *testing.B) {
			src := smallLlama(b, layers)
			for range b.N {
				out := filepath.Join(b.TempDir(), "out")
				cmd := exec.Command(strataBin, "export", src, "--out", out, "--plugin-dir", llamaDir, "--weights", "materialize")
				if msg, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%v\n%s", err, msg)
				}
				rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss // KiB
				b.ReportMetric(float64(rss)/1024, "peak-RSS-MiB")
				os.RemoveAll(out)
			}
		})
	}
}

func smallLlama(b *testing.B, layers int) string {
	return headerOnlyLlama(b, llamaShape{hidden: 512, intermediate: 1408, layers: int64(layers), heads: 8, kvHeads: 2})
}
