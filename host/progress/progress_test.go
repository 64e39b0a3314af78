package progress

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a strings.Builder safe for the meter's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func shorten(t *testing.T) {
	d, tick, line := Delay, Tick, LineEvery
	Delay, Tick, LineEvery = 0, time.Millisecond, time.Millisecond
	t.Cleanup(func() { Delay, Tick, LineEvery = d, tick, line })
}

func TestPlainLinesAndATerminalBar(t *testing.T) {
	shorten(t)
	for _, tty := range []bool{false, true} {
		var out syncBuffer
		m := Start(&out, tty, "copying shards", 2000)
		m.Writer(&strings.Builder{}).Write(make([]byte, 1000))
		time.Sleep(20 * time.Millisecond)
		m.Add(1000)
		m.Stop()
		m.Stop()
		got := out.String()
		if !strings.Contains(got, "copying shards: 1.0 kB of 2.0 kB (50%)") || !strings.Contains(got, "2.0 kB of 2.0 kB (100%)") {
			t.Errorf("tty %v: %q", tty, got)
		}
		if tty != strings.Contains(got, "\r\x1b[K[###") {
			t.Errorf("tty %v: bar drawn %v: %q", tty, !tty, got)
		}
		if !strings.Contains(got, "ETA") {
			t.Errorf("tty %v: no ETA: %q", tty, got)
		}
	}
}

func TestQuietAndShortPhasesShowNothing(t *testing.T) {
	m := Start(nil, false, "x", 10) // --quiet
	m.Add(10)
	m.Stop()
	var out syncBuffer
	m = Start(&out, false, "x", 10) // ends before Delay
	m.Add(10)
	m.Stop()
	if out.String() != "" {
		t.Errorf("a phase shorter than %v printed %q", Delay, out.String())
	}
}

// Phases running at once on one writer (windows materialised by -j 2)
// draw one aggregate bar, not bars that interleave and wrap.
func TestParallelPhasesShareOneBar(t *testing.T) {
	shorten(t)
	Delay = 30 * time.Millisecond
	for _, tty := range []bool{false, true} {
		var out syncBuffer
		a := Start(&out, tty, "materialising weights/window_0_0.safetensors", 1000)
		b := Start(&out, tty, "materialising weights/window_1_1.safetensors", 3000)
		other := Start(&syncBuffer{}, tty, "copying shards", 10) // another writer: its own bar
		a.Add(1000)
		b.Add(1000)
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "(2 running)") && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		a.Stop()
		b.Add(2000)
		b.Stop()
		other.Stop()
		got := out.String()
		if strings.Contains(got, "window_") {
			t.Errorf("tty %v: a phase drew its own bar:\n%q", tty, got)
		}
		if !strings.Contains(got, "materialising 2 parts (2 running): 2.0 kB of 4.0 kB (50%)") ||
			!strings.Contains(got, "materialising 2 parts: 4.0 kB of 4.0 kB (100%)") {
			t.Errorf("tty %v: no aggregate of both phases:\n%q", tty, got)
		}
		if tty && strings.Count(got, "\n") != 1 {
			t.Errorf("the terminal bar ends %d lines, want the one last line:\n%q", strings.Count(got, "\n"), got)
		}
	}
}
