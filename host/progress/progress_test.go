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
