package procstat

import (
	"os"
	"runtime"
	"testing"
)

func TestPeakRSSGrowsWithUse(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("procfs VmHWM is Linux only") // elsewhere PeakRSS says it does not know
	}
	before, ok := PeakRSS(0)
	if !ok || before <= 0 {
		t.Fatalf("PeakRSS(self) = %d, %v", before, ok)
	}
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = 1 // touch every page
	}
	after, _ := PeakRSS(os.Getpid())
	if after < before+60<<20 {
		t.Errorf("peak RSS %d after touching 64 MiB, was %d", after, before)
	}
	runtime.KeepAlive(buf)
	if _, ok := PeakRSS(1 << 30); ok {
		t.Error("a pid that does not exist has a peak RSS")
	}
}
