// Package progress reports a long phase (copying shards, materialising
// weights): a bar redrawn in place on a terminal, a plain line every few
// seconds otherwise, with bytes/s and ETA. Nothing is shown for a phase
// that ends within a second, nor when the writer is nil (--quiet).
package progress

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Timings, variables so that tests can shorten them.
var (
	// Delay is how long a phase runs before anything is shown.
	Delay = time.Second
	// Tick is how often a terminal bar is redrawn.
	Tick = 250 * time.Millisecond
	// LineEvery is how often a plain line is printed.
	LineEvery = 5 * time.Second
)

// Meter counts the bytes of one phase.
type Meter struct {
	w     io.Writer
	tty   bool
	what  string
	total int64
	start time.Time
	done  atomic.Int64

	mu      sync.Mutex
	shown   bool // something was printed
	quit    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
}

// Start begins reporting phase what of total bytes to w (nil: silent).
func Start(w io.Writer, tty bool, what string, total int64) *Meter {
	m := &Meter{w: w, tty: tty, what: what, total: total, start: time.Now(), quit: make(chan struct{})}
	if w == nil || total <= 0 {
		return m
	}
	every := LineEvery
	if tty {
		every = Tick
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-m.quit:
			return
		case <-time.After(Delay):
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			m.show(false)
			select {
			case <-m.quit:
				return
			case <-t.C:
			}
		}
	}()
	return m
}

// Add counts n more bytes done. A nil Meter counts nothing (so do its
// Reader, Writer and Stop).
func (m *Meter) Add(n int64) {
	if m != nil {
		m.done.Add(n)
	}
}

// Done is the bytes counted so far.
func (m *Meter) Done() int64 {
	if m == nil {
		return 0
	}
	return m.done.Load()
}

// Writer counts what passes through w.
func (m *Meter) Writer(w io.Writer) io.Writer {
	if m == nil {
		return w
	}
	return countingWriter{w, m}
}

// Reader counts what is read through r.
func (m *Meter) Reader(r io.Reader) io.Reader {
	if m == nil {
		return r
	}
	return countingReader{r, m}
}

// Stop ends the report; when something was shown, a last line says how the
// phase ended. Safe to call more than once.
func (m *Meter) Stop() {
	if m == nil {
		return
	}
	m.stopped.Do(func() {
		close(m.quit)
		m.wg.Wait()
		m.mu.Lock()
		shown := m.shown
		m.mu.Unlock()
		if shown {
			m.show(true)
		}
	})
}

func (m *Meter) show(last bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shown = true
	done := m.done.Load()
	el := time.Since(m.start)
	rate := 0.0
	if s := el.Seconds(); s > 0 {
		rate = float64(done) / s
	}
	eta := "?"
	if rate > 0 {
		eta = (time.Duration(float64(max(0, m.total-done))/rate) * time.Second).Round(time.Second).String()
	}
	frac := min(1, float64(done)/float64(m.total))
	line := fmt.Sprintf("%s: %s of %s (%.0f%%), %s/s", m.what, Bytes(done), Bytes(m.total), 100*frac, Bytes(int64(rate)))
	if last {
		line += fmt.Sprintf(", %s", el.Round(100*time.Millisecond))
	} else {
		line += ", ETA " + eta
	}
	if !m.tty {
		fmt.Fprintln(m.w, line)
		return
	}
	const width = 30
	fill := int(frac * width)
	fmt.Fprintf(m.w, "\r\x1b[K[%s%s] %s", strings.Repeat("#", fill), strings.Repeat("-", width-fill), line)
	if last {
		fmt.Fprintln(m.w)
	}
}

type countingWriter struct {
	w io.Writer
	m *Meter
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.m.Add(int64(n))
	return n, err
}

type countingReader struct {
	r io.Reader
	m *Meter
}

func (c countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.m.Add(int64(n))
	return n, err
}

// Bytes writes a byte count with a decimal unit.
func Bytes(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}
