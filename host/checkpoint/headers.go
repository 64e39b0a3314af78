package checkpoint

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// headerReads reads shard headers on up to headerWorkers goroutines, ahead
// of the caller, which takes them in order (wait): parsing GLM-4.6-FP8's
// 73 headers is a fifth of its export's CPU, and a second core is free
// while the plugin starts.
type headerReads struct {
	results []headerRead
	ready   []chan struct{}
	next    atomic.Int64
	stopped atomic.Bool
	wg      sync.WaitGroup
}

type headerRead struct {
	shard     Shard
	bytesRead int64
	err       error
}

const headerWorkers = 4

func (c *Checkpoint) readHeaders(names []string) *headerReads {
	r := &headerReads{results: make([]headerRead, len(names)), ready: make([]chan struct{}, len(names))}
	for i := range r.ready {
		r.ready[i] = make(chan struct{})
	}
	workers := min(runtime.GOMAXPROCS(0), headerWorkers, len(names))
	r.wg.Add(workers)
	for range workers {
		go func() {
			defer r.wg.Done()
			for {
				i := int(r.next.Add(1) - 1)
				if i >= len(names) {
					return
				}
				if !r.stopped.Load() {
					h := &r.results[i]
					h.shard, h.err = readShard(c.path(names[i]), names[i], &h.bytesRead)
				}
				close(r.ready[i])
			}
		}()
	}
	return r
}

// wait is shard i's header, once read.
func (r *headerReads) wait(i int) headerRead {
	<-r.ready[i]
	h := r.results[i]
	r.results[i] = headerRead{} // the caller keeps what it needs
	return h
}

// stop lets the workers skip what is left (after an error) and waits for
// them: no goroutine outlives the open.
func (r *headerReads) stop() {
	r.stopped.Store(true)
	r.wg.Wait()
}
