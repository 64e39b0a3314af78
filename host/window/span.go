// Package window cuts a model's decoder layers into windows, keeps the
// manifest that lets a re-run skip unchanged windows, and stitches window
// models back into one.
package window

import (
	"fmt"
	"path"
)

// Span is a window of decoder layers First..Last (inclusive) of Count.
type Span struct{ First, Last, Count int32 }

// IsFirst reports whether the window starts the model (takes input_ids).
func (s Span) IsFirst() bool { return s.First == 0 }

// IsLast reports whether the window ends the model (returns logits).
func (s Span) IsLast() bool { return s.Last == s.Count-1 }

func (s Span) String() string { return fmt.Sprintf("%d-%d", s.First, s.Last) }

// Dir holds the window models inside the output directory.
const Dir = "windows"

// File is the window's model file, relative to the output directory.
func (s Span) File() string { return path.Join(Dir, fmt.Sprintf("window_%d_%d.onnx", s.First, s.Last)) }

// Whole is the span of all count layers.
func Whole(count int) Span { return Span{0, int32(count) - 1, int32(count)} }

// Cut splits count layers into windows of size layers; the last may be
// shorter, and a size beyond count gives one window.
func Cut(count, size int) ([]Span, error) {
	if size <= 0 {
		return nil, fmt.Errorf("window size must be at least 1, got %d", size)
	}
	var spans []Span
	for first := 0; first < count; first += size {
		last := min(first+size, count) - 1
		spans = append(spans, Span{int32(first), int32(last), int32(count)})
	}
	return spans, nil
}
