package convert

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	meter "github.com/strata-llm/strata/host/progress"
)

// progress reports layers done, bytes/s and ETA: a bar redrawn in place
// on a terminal, one plain line per finished layer otherwise.
type progress struct {
	w       io.Writer
	tty     bool
	start   time.Time
	written atomic.Int64 // tensor bytes written by this run
	total   int64        // tensor bytes this run writes (pending layers)
	mu      sync.Mutex
	done    int // layers present (kept or finished)
	layers  int // shards this run writes (layers, and the tail in a whole run)
	bytesOf map[int]int64
	quit    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func newProgress(w io.Writer, tty bool, p *plan, todo []int) *progress {
	pr := &progress{w: w, tty: tty, start: time.Now(), layers: len(todo), bytesOf: map[int]int64{}, quit: make(chan struct{})}
	for _, l := range todo {
		var n int64
		for _, g := range p.byLayer[l] {
			for _, e := range g.Outputs {
				n += entryBytes(e.DType, e.Shape)
			}
		}
		pr.bytesOf[l] = n
		pr.total += n
	}
	if w != nil && tty && len(todo) > 0 {
		pr.wg.Add(1)
		go func() {
			defer pr.wg.Done()
			t := time.NewTicker(250 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-pr.quit:
					return
				case <-t.C:
					pr.draw()
				}
			}
		}()
	}
	return pr
}

func entryBytes(dt string, shape []int64) int64 {
	n := int64(elemBytes(dt))
	for _, d := range shape {
		n *= d
	}
	return n
}

// keep counts a layer found complete from an earlier run.
func (pr *progress) keep(l int) {
	pr.mu.Lock()
	pr.done++
	pr.total -= pr.bytesOf[l]
	pr.mu.Unlock()
}

func (pr *progress) finish(l int) {
	pr.mu.Lock()
	defer pr.mu.Unlock() // workers finish concurrently; one line at a time
	pr.done++
	done := pr.done
	if pr.w == nil || pr.tty {
		return
	}
	rate, eta := pr.rate()
	what := fmt.Sprintf("layer %d", l)
	if l < 0 {
		what = "tail"
	}
	fmt.Fprintf(pr.w, "%s written (%s): %d/%d shards, %s/s, ETA %s\n", what, meter.Bytes(pr.bytesOf[l]), done, pr.layers, meter.Bytes(int64(rate)), eta)
}

func (pr *progress) rate() (float64, string) {
	el := time.Since(pr.start).Seconds()
	n := pr.written.Load()
	if el <= 0 || n == 0 {
		return 0, "?"
	}
	rate := float64(n) / el
	left := time.Duration(float64(max(0, pr.total-n))/rate) * time.Second
	return rate, left.Round(time.Second).String()
}

func (pr *progress) draw() {
	pr.mu.Lock()
	done := pr.done
	pr.mu.Unlock()
	const width = 30
	frac := 0.0
	if pr.total > 0 {
		frac = min(1, float64(pr.written.Load())/float64(pr.total))
	}
	fill := int(frac * width)
	rate, eta := pr.rate()
	fmt.Fprintf(pr.w, "\r\x1b[K[%s%s] %d/%d shards  %s  %s/s  ETA %s",
		strings.Repeat("#", fill), strings.Repeat("-", width-fill), done, pr.layers, meter.Bytes(pr.written.Load()), meter.Bytes(int64(rate)), eta)
}

// stop ends the bar (idempotent).
func (pr *progress) stop() {
	pr.once.Do(func() {
		close(pr.quit)
		pr.wg.Wait()
		if pr.w != nil && pr.tty && pr.layers > 0 {
			pr.draw()
			fmt.Fprintln(pr.w)
		}
	})
}
