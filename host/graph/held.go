package graph

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// Held is a graph's encoded initializers kept apart from its model
// (Builder.ModelHeld): the chunks a Builder spilled to its file, in order,
// then those still in memory.
type Held struct {
	spill   *os.File // nil: nothing spilled
	spilled int64    // bytes [0, spilled) of spill
	chunks  [][]byte
	err     error // the spill's, if writing it failed
}

// Recycle gives h's chunks in memory to the builders made after for reuse;
// nothing may read h after.
func (h *Held) Recycle() {
	for _, c := range h.chunks {
		if i := chunkClass(cap(c)); i >= 0 {
			c = c[:0]
			chunkPools[i].Put(&c)
		}
	}
	h.chunks = nil
}

// Len is the size of the encoded initializers.
func (h Held) Len() int64 {
	n := h.spilled
	for _, c := range h.chunks {
		n += int64(len(c))
	}
	return n
}

// WriteTo writes the encoded initializers to w.
func (h Held) WriteTo(w io.Writer) (int64, error) {
	if h.err != nil {
		return 0, h.err
	}
	var n int64
	if h.spilled > 0 {
		m, err := io.Copy(w, io.NewSectionReader(h.spill, 0, h.spilled))
		n += m
		if err == nil && m != h.spilled {
			err = fmt.Errorf("reading the spilled initializers back: %d of %d bytes", m, h.spilled)
		}
		if err != nil {
			return n, err
		}
	}
	for _, c := range h.chunks {
		m, err := w.Write(c)
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// bytes is the encoded initializers in one slice.
func (h Held) bytes() ([]byte, error) {
	if h.spilled == 0 && len(h.chunks) == 1 {
		return h.chunks[0], nil
	}
	var buf bytes.Buffer
	buf.Grow(int(h.Len()))
	_, err := h.WriteTo(&buf)
	return buf.Bytes(), err
}

// A Spill is a file a Builder writes its full chunks of encoded
// initializers to, so that only the last stays in memory: GLM-4.6-FP8's
// 88,000 initializers are 14 MB encoded, held until model.onnx is written
// while the heap is fullest. The file is opened at the first full chunk
// (models of a few thousand initializers never spill); the caller closes
// it once the model is written.
type Spill struct {
	open func() (*os.File, error)
	f    *os.File
	n    int64
}

// NewSpill is a spill that opens its file with open (an unnamed file is
// best: nothing is left behind by a killed process).
func NewSpill(open func() (*os.File, error)) *Spill { return &Spill{open: open} }

// write appends a full chunk to the file.
func (s *Spill) write(c []byte) error {
	if s.f == nil {
		f, err := s.open()
		if err != nil {
			return fmt.Errorf("spilling encoded initializers: %w", err)
		}
		s.f = f
	}
	if _, err := s.f.Write(c); err != nil {
		return fmt.Errorf("spilling encoded initializers to %s: %w", s.f.Name(), err)
	}
	s.n += int64(len(c))
	return nil
}

// Close closes the spill's file, if it opened one.
func (s *Spill) Close() error {
	if s == nil || s.f == nil {
		return nil
	}
	return s.f.Close()
}
