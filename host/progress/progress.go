// Package progress reports a long phase (copying shards, materialising
// weights): a bar redrawn in place on a terminal, a plain line every few
// seconds otherwise, with bytes/s and ETA; phases running at once on one
// writer (parallel windows) share one aggregate bar. Nothing is shown for
// a phase that ends within a second, nor when the writer is nil (--quiet).
package progress

import (
	"fmt"
	"io"
	"reflect"
	"slices"
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
	what  string
	total int64
	done  atomic.Int64

	b       *board // nil: nothing is shown
	stopped sync.Once
}

// Start begins reporting phase what of total bytes to w (nil: silent).
// Phases that run at once on the same writer (windows materialised in
// parallel) share one aggregate bar instead of drawing bars that
// interleave.
func Start(w io.Writer, tty bool, what string, total int64) *Meter {
	m := &Meter{what: what, total: total}
	if w == nil || total <= 0 {
		return m
	}
	m.b = join(w, tty, m)
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

// Stop ends the meter's phase; when it was the last on its writer and
// something was shown, a last line says how the phases ended. Safe to call
// more than once.
func (m *Meter) Stop() {
	if m == nil || m.b == nil {
		return
	}
	m.stopped.Do(func() { m.b.leave(m) })
}

// A board draws the meters running at once on one writer as one bar:
// their bytes summed, labelled with the first one's phase alone, or with
// how many there were.
type board struct {
	w     io.Writer
	tty   bool
	start time.Time

	mu       sync.Mutex
	active   []*Meter
	whats    []string // every meter's phase, in order of start
	total    int64    // every meter's
	finished int64    // bytes of the meters stopped
	shown    bool     // something was printed

	quit chan struct{}
	wg   sync.WaitGroup
}

// boards are the boards drawing now, by writer (comparable writers only:
// another kind gets a board per meter).
var (
	boardsMu sync.Mutex
	boards   = map[io.Writer]*board{}
)

func join(w io.Writer, tty bool, m *Meter) *board {
	boardsMu.Lock()
	defer boardsMu.Unlock()
	shared := reflect.TypeOf(w).Comparable()
	b := boards[w]
	fresh := !shared || b == nil
	if fresh {
		b = &board{w: w, tty: tty, start: time.Now(), quit: make(chan struct{})}
		if shared {
			boards[w] = b
		}
	}
	b.mu.Lock()
	b.active = append(b.active, m)
	b.whats = append(b.whats, m.what)
	b.total += m.total
	b.mu.Unlock()
	if fresh {
		b.wg.Add(1)
		go b.run()
	}
	return b
}

// leave removes m; the last meter to leave stops the board.
func (b *board) leave(m *Meter) {
	boardsMu.Lock()
	b.mu.Lock()
	b.active = slices.DeleteFunc(b.active, func(a *Meter) bool { return a == m })
	b.finished += m.done.Load()
	last := len(b.active) == 0
	if last && boards[b.w] == b {
		delete(boards, b.w)
	}
	b.mu.Unlock()
	boardsMu.Unlock()
	if !last {
		return
	}
	close(b.quit)
	b.wg.Wait()
	b.mu.Lock()
	shown := b.shown
	b.mu.Unlock()
	if shown {
		b.show(true)
	}
}

func (b *board) run() {
	defer b.wg.Done()
	select {
	case <-b.quit:
		return
	case <-time.After(Delay):
	}
	every := LineEvery
	if b.tty {
		every = Tick
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		b.show(false)
		select {
		case <-b.quit:
			return
		case <-t.C:
		}
	}
}

// label names what the board counts: the phase, or for several
// "<the phases' common first word> N parts (k running)".
func (b *board) label(last bool) string {
	if len(b.whats) == 1 {
		return b.whats[0]
	}
	verb, _, _ := strings.Cut(b.whats[0], " ")
	for _, w := range b.whats[1:] {
		if v, _, _ := strings.Cut(w, " "); v != verb {
			verb = "working on"
		}
	}
	if last {
		return fmt.Sprintf("%s %d parts", verb, len(b.whats))
	}
	return fmt.Sprintf("%s %d parts (%d running)", verb, len(b.whats), len(b.active))
}

func (b *board) show(last bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.shown = true
	done := b.finished
	for _, m := range b.active {
		done += m.done.Load()
	}
	el := time.Since(b.start)
	rate := 0.0
	if s := el.Seconds(); s > 0 {
		rate = float64(done) / s
	}
	eta := "?"
	if rate > 0 {
		eta = (time.Duration(float64(max(0, b.total-done))/rate) * time.Second).Round(time.Second).String()
	}
	frac := min(1, float64(done)/float64(b.total))
	line := fmt.Sprintf("%s: %s of %s (%.0f%%), %s/s", b.label(last), Bytes(done), Bytes(b.total), 100*frac, Bytes(int64(rate)))
	if last {
		line += fmt.Sprintf(", %s", el.Round(100*time.Millisecond))
	} else {
		line += ", ETA " + eta
	}
	if !b.tty {
		fmt.Fprintln(b.w, line)
		return
	}
	const width = 30
	fill := int(frac * width)
	fmt.Fprintf(b.w, "\r\x1b[K[%s%s] %s", strings.Repeat("#", fill), strings.Repeat("-", width-fill), line)
	if last {
		fmt.Fprintln(b.w)
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
