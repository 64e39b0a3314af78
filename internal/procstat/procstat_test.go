package procstat

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
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

func TestChild(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no procfs")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	cmd := exec.Command(sleep, "10")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for _, tc := range []struct {
		name   string
		parent int
		argv0  string
		want   int
	}{
		{"this process's child", os.Getpid(), sleep, cmd.Process.Pid},
		{"started otherwise", os.Getpid(), "/no/such/binary", 0},
		{"another parent's", 1, sleep, 0},
	} {
		if got := Child(tc.parent, tc.argv0); got != tc.want {
			t.Errorf("%s: Child = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestDescendantsAndKill(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no procfs")
	}
	sh := exec.Command("sh", "-c", "sleep 10 & wait")
	if err := sh.Start(); err != nil {
		t.Skip("no sh:", err)
	}
	defer func() { sh.Process.Kill(); sh.Wait() }()
	var below []Proc
	for range 100 { // until sh has started sleep
		if below = Descendants(sh.Process.Pid); len(below) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(below) != 1 || below[0].PPid != sh.Process.Pid {
		t.Fatalf("descendants of sh: %+v, want its sleep", below)
	}
	stale := below[0]
	stale.Start += "0" // another process that had the pid
	stale.Kill()
	if _, ok := stat(below[0].Pid); !ok {
		t.Fatal("Kill of a stale Proc killed the process")
	}
	below[0].Kill()
	sh.Wait() // sh's wait returns once sleep is gone
	if len(Descendants(sh.Process.Pid)) != 0 {
		t.Error("the sleep is still there")
	}
}
