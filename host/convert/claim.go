package convert

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/strata-llm/strata/host/outdir"
)

// LayersLock is the file in a conversion's directory whose bytes stand for
// its shards, each locked (fcntl, released when the process ends, however
// it ends) by the one run writing that shard: byte 0 the tail, byte l+1
// layer l. Runs of disjoint --layers share the directory; a run whose
// layers another holds is refused up front, naming it, instead of the two
// removing each other's files mid-write. (fcntl locks belong to a process:
// conversions inside one process are not told apart, as the CLI runs one.)
const LayersLock = ManifestDir + "/layers.lock"

// claim locks the bytes of layers (-1: the tail) in LayersLock for this
// run; the locks last until release. A refusal ends with advice.
func (o *outDir) claim(layers []int, advice string) error {
	if len(layers) == 0 {
		return nil
	}
	if o.lock == nil {
		f, err := o.openLock()
		if err != nil {
			return err
		}
		o.lock = f
	}
	for _, r := range byteRuns(layers) {
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: r[0], Len: r[1] - r[0]}
		err := unix.FcntlFlock(o.lock.Fd(), unix.F_SETLK, &lk)
		if err == nil {
			continue
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			return fmt.Errorf("locking layers in %s: %w", o.d.Join(LayersLock), err)
		}
		return o.busy(r, advice)
	}
	return nil
}

// busy says which run holds (part of) the byte range r, as fcntl knows it.
func (o *outDir) busy(r [2]int64, advice string) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: r[0], Len: r[1] - r[0]}
	who, held := "another strata process", describeBytes(r[0], r[1])
	if unix.FcntlFlock(o.lock.Fd(), unix.F_GETLK, &lk) == nil && lk.Type != unix.F_UNLCK {
		if lk.Pid > 0 {
			who += fmt.Sprintf(" (pid %d)", lk.Pid)
		}
		end := r[1]
		if lk.Len > 0 {
			end = min(end, lk.Start+lk.Len)
		}
		held = describeBytes(max(r[0], lk.Start), end)
	}
	return &outdir.Error{Dir: o.d.Path(), Reason: fmt.Sprintf("%s is converting %s into it (it holds their lock in %s); %s", who, held, LayersLock, advice), Err: outdir.ErrBusy}
}

// openLock opens LayersLock for writing (fcntl's write locks need it),
// making it if this is the first run: through the directory's checks (a
// file strata wrote, reached through no link), then by path, which must
// lead to that same file.
func (o *outDir) openLock() (*os.File, error) {
	if _, err := o.d.WriteFileOnce(LayersLock, nil); err != nil {
		return nil, err
	}
	ro, err := o.d.Open(LayersLock)
	if err != nil {
		return nil, err
	}
	want, err := ro.Stat()
	ro.Close() // before any lock is taken: closing a descriptor drops the process's fcntl locks on the file
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(o.d.Join(LayersLock), os.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if got, err := f.Stat(); err != nil || !os.SameFile(got, want) {
		f.Close()
		return nil, fmt.Errorf("%s changed while it was opened: another process is altering the directory", o.d.Join(LayersLock))
	}
	return f, nil
}

// release drops this run's layer locks.
func (o *outDir) release() {
	if o.lock != nil {
		o.lock.Close()
		o.lock = nil
	}
}

// byteRuns turns layers (-1: the tail) into runs of consecutive lock bytes,
// each [start, end).
func byteRuns(layers []int) [][2]int64 {
	var runs [][2]int64
	for _, l := range layers {
		b := int64(l + 1)
		if n := len(runs); n > 0 && runs[n-1][1] == b {
			runs[n-1][1]++
			continue
		}
		runs = append(runs, [2]int64{b, b + 1})
	}
	return runs
}

// describeBytes names the shards of lock bytes [start, end).
func describeBytes(start, end int64) string {
	var parts []string
	if start == 0 {
		parts = append(parts, "the tail")
		start = 1
	}
	switch {
	case end-start == 1:
		parts = append([]string{fmt.Sprintf("layer %d", start-1)}, parts...)
	case end-start > 1:
		parts = append([]string{fmt.Sprintf("layers %d-%d", start-1, end-2)}, parts...)
	}
	return strings.Join(parts, " and ")
}
