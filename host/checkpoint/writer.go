package checkpoint

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	syncatomic "sync/atomic"

	"github.com/strata-llm/strata/internal/atomic"
	"github.com/strata-llm/strata/sdk/dtype"
)

// Entry is one tensor of a safetensors file to write.
type Entry struct {
	Name  string
	DType string // safetensors name
	Shape []int64
}

// Writer streams a safetensors file: the header is written first from the
// entries, then each tensor's data in entry order, so only one tensor is in
// memory at a time. The file appears under its name only when Close
// succeeds. (Written here, not with github.com/nlpodyssey/safetensors: that
// library needs every tensor in memory at once and has no FP8 dtypes.)
type Writer struct {
	path    string
	sink    Sink
	entries []Entry
	offsets []int64 // absolute file offset of each entry's data
	sizes   []int64
	next    int
	part    int64 // bytes of entry next appended so far
}

// Sink receives a file's bytes and puts the file in place on Commit (an
// output directory's file, see host/outdir); Abort discards it.
type Sink interface {
	io.Writer
	Commit() error
	Abort()
}

// CreateSafetensors starts path with the given tensors, in this order,
// through a temporary file beside it.
func CreateSafetensors(path string, entries []Entry) (*Writer, error) {
	if _, err := Layout(entries); err != nil {
		return nil, err
	}
	sink, err := FileSink(path)
	if err != nil {
		return nil, err
	}
	return NewWriter(path, sink, entries)
}

// FileSink writes path through a temporary file beside it, renamed into
// place on Commit (outside an output directory strata owns: tools, tests).
func FileSink(path string) (Sink, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), atomic.TempPrefix+filepath.Base(path)+"-*")
	if err != nil {
		return nil, err
	}
	return &tempSink{f: f, path: path}, nil
}

// NewWriter writes a safetensors file of the given tensors, in this order,
// into sink; name is for messages.
func NewWriter(name string, sink Sink, entries []Entry) (*Writer, error) {
	l, err := Layout(entries)
	if err != nil {
		sink.Abort()
		return nil, err
	}
	w := &Writer{path: name, sink: sink, entries: entries, offsets: l.Offsets, sizes: l.Sizes}
	var length [8]byte
	binary.LittleEndian.PutUint64(length[:], uint64(len(l.Header)))
	if _, err := sink.Write(append(length[:], l.Header...)); err != nil {
		w.Abort()
		return nil, fmt.Errorf("writing %s: %w", name, err)
	}
	return w, nil
}

// tempSink is a temporary file renamed to path on Commit, mode 0644 less
// the umask.
type tempSink struct {
	f    *os.File
	path string
}

func (s *tempSink) Write(p []byte) (int, error) { return s.f.Write(p) }

func (s *tempSink) Commit() error {
	err := s.f.Chmod(0o644 &^ atomic.Umask())
	if err == nil {
		err = s.f.Close()
	} else {
		s.f.Close()
	}
	if err == nil {
		err = os.Rename(s.f.Name(), s.path)
	}
	if err != nil {
		os.Remove(s.f.Name())
	}
	return err
}

func (s *tempSink) Abort() {
	s.f.Close()
	os.Remove(s.f.Name())
}

// FileLayout is where a safetensors file of given entries puts everything.
type FileLayout struct {
	Header  []byte  // the JSON header, padded
	Offsets []int64 // absolute file offset of each entry's data
	Sizes   []int64 // bytes of each entry
	Size    int64   // the whole file
}

// Layout lays the data out contiguously in entry order and encodes the JSON
// header, padded with spaces to a multiple of 8 bytes, without writing.
func Layout(entries []Entry) (FileLayout, error) {
	var l FileLayout
	fields := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var at int64
	for _, e := range entries {
		info, ok := dtype.FromSafetensors(e.DType)
		if !ok {
			return l, fmt.Errorf("tensor %s: unknown dtype %q", e.Name, e.DType)
		}
		n := int64(1)
		for _, d := range e.Shape {
			n *= d
		}
		size := info.ByteSize(n)
		shape := e.Shape
		if shape == nil {
			shape = []int64{}
		}
		fields[e.Name] = map[string]any{"dtype": e.DType, "shape": shape, "data_offsets": []int64{at, at + size}}
		l.Offsets = append(l.Offsets, at)
		l.Sizes = append(l.Sizes, size)
		at += size
	}
	header, err := json.Marshal(fields)
	if err != nil {
		return l, err
	}
	if pad := (8 - len(header)%8) % 8; pad > 0 {
		header = append(header, strings.Repeat(" ", pad)...)
	}
	l.Header = header
	for i := range l.Offsets {
		l.Offsets[i] += 8 + int64(len(header))
	}
	l.Size = 8 + int64(len(header)) + at
	return l, nil
}

// Offset is the absolute file offset of entry i's data.
func (w *Writer) Offset(i int) int64 { return w.offsets[i] }

// Write writes the next tensor's data.
func (w *Writer) Write(data []byte) error {
	if w.next < len(w.entries) {
		if w.part != 0 {
			return fmt.Errorf("%s: tensor %s is partly appended (%d of %d bytes)", w.path, w.entries[w.next].Name, w.part, w.sizes[w.next])
		}
		if int64(len(data)) != w.sizes[w.next] {
			return fmt.Errorf("%s: tensor %s has %d bytes, declared %d", w.path, w.entries[w.next].Name, len(data), w.sizes[w.next])
		}
	}
	return w.Append(data)
}

// Append writes the next part of the current tensor's data: the tensor is
// complete once its declared size is appended, and the next one begins.
func (w *Writer) Append(part []byte) error {
	if w.next >= len(w.entries) {
		return fmt.Errorf("%s: more tensors written than declared", w.path)
	}
	if w.part+int64(len(part)) > w.sizes[w.next] {
		return fmt.Errorf("%s: tensor %s has more than the %d bytes declared", w.path, w.entries[w.next].Name, w.sizes[w.next])
	}
	if _, err := w.sink.Write(part); err != nil {
		return fmt.Errorf("writing %s: %w", w.path, err)
	}
	if w.part += int64(len(part)); w.part == w.sizes[w.next] {
		w.next, w.part = w.next+1, 0
	}
	return nil
}

// Close finishes the file and renames it into place.
func (w *Writer) Close() error {
	if w.next != len(w.entries) {
		w.Abort()
		return fmt.Errorf("%s: %d of %d tensors written", w.path, w.next, len(w.entries))
	}
	if err := w.sink.Commit(); err != nil {
		return fmt.Errorf("writing %s: %w", w.path, err)
	}
	return nil
}

// Abort discards the unfinished file.
func (w *Writer) Abort() { w.sink.Abort() }

// ReadTensor reads a tensor's stored bytes (materialising reads data; an
// export by reference never calls this).
func (c *Checkpoint) ReadTensor(key string) ([]byte, error) {
	t, ok := c.tensors[key]
	if !ok {
		return nil, fmt.Errorf("tensor %s is not in the checkpoint", key)
	}
	data := make([]byte, t.Length)
	if err := c.ReadTensorAt(key, data, 0); err != nil {
		return nil, err
	}
	return data, nil
}

// ReadTensorAt reads len(p) of a tensor's stored bytes from offset off
// within the tensor, for weights computed a slice at a time.
func (c *Checkpoint) ReadTensorAt(key string, p []byte, off int64) error {
	t, ok := c.tensors[key]
	if !ok {
		return fmt.Errorf("tensor %s is not in the checkpoint", key)
	}
	if off < 0 || off+int64(len(p)) > t.Length {
		return fmt.Errorf("tensor %s: bytes %d..%d are outside its %d", key, off, off+int64(len(p)), t.Length)
	}
	path := filepath.Join(c.Dir, t.Shard)
	if sh, ok := c.Shard(t.Shard); ok && sh.Path != "" {
		path = sh.Path
	}
	f, _, err := OpenRegular(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(p, t.Offset+off); err != nil {
		return fmt.Errorf("reading tensor %s from %s: %w", key, t.Shard, err)
	}
	syncatomic.AddInt64(&c.BytesRead, int64(len(p))) // windows materialise at once
	return nil
}

// writeChunk is how much a cancellable sink writes between checks.
const writeChunk = 8 << 20

// CancelSink makes a sink's writes stop within a chunk once ctx is
// cancelled, so a multi-gigabyte tensor does not delay Ctrl-C.
func CancelSink(ctx context.Context, s Sink) Sink { return &cancelSink{ctx: ctx, Sink: s} }

type cancelSink struct {
	ctx context.Context
	Sink
}

func (s *cancelSink) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if err := s.ctx.Err(); err != nil {
			return n, err
		}
		m, err := s.Sink.Write(p[:min(len(p), writeChunk)])
		n += m
		if err != nil {
			return n, err
		}
		p = p[m:]
	}
	return n, nil
}
