// Package weights turns the weight bindings of a plan into ONNX initializers
// that reference the checkpoint's own bytes, links the shards they live in
// into the output directory, and writes weight_spec.json.
package weights

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
	"github.com/strata-llm/strata/sdk/dtype"
)

// Spec is weight_spec.json: every weight the graph uses and where its bytes
// are. Documented in docs/weight-spec.md. model.onnx's metadata holds, under
// MetadataKey, a SpecReference to it; a window model's holds the spec itself
// (compact), for stitching.
type Spec struct {
	Format       string   `json:"format"`
	Version      int      `json:"version"`
	Producer     Producer `json:"producer"`
	ModelType    string   `json:"model_type"`
	ComputeDType string   `json:"compute_dtype"`
	// Mode is how the graph reaches its weights: reference or materialize.
	Mode string `json:"mode"`
	// Checkpoint names the source checkpoint without a path of the
	// machine: its hub id and commit (org/name@commit) when it came from
	// the Hugging Face cache, else its directory's name.
	Checkpoint string   `json:"checkpoint"`
	Files      []File   `json:"files"`
	Weights    []Weight `json:"weights"`
}

// Format, version and metadata key of our weight spec.
const (
	SpecFormat  = "strata.weight_spec"
	SpecVersion = 1
	MetadataKey = "strata.weight_spec"
)

// Producer names what wrote the spec.
type Producer struct {
	Strata        string `json:"strata"`
	Plugin        string `json:"plugin"`
	PluginVersion string `json:"plugin_version"`
}

// File is a file the graph reads its weights from: a checkpoint shard, or a
// file of materialised weights.
type File struct {
	// Path is where the model finds the file, relative to the model file.
	Path string `json:"path"`
	// Kind is "checkpoint" (a shard of the source checkpoint) or
	// "materialized" (weights strata computed, a safetensors file).
	Kind string `json:"kind"`
	// Source is the shard's name in the checkpoint directory (checkpoint files).
	Source string `json:"source,omitempty"`
	Size   int64  `json:"size"`
	// Link says how Path reaches Source: hardlink, copy or symlink.
	Link string `json:"link,omitempty"`
}

// File kinds.
const (
	KindCheckpoint   = "checkpoint"
	KindMaterialized = "materialized"
)

// Weight is one graph weight: the value Name the layers read, of DType and
// Shape, computed by Transform from checkpoint tensors Sources (Transform
// absent: the one source as it is). With --weights materialize, Data says
// where strata wrote the result.
type Weight struct {
	Name      string          `json:"name"`
	DType     string          `json:"dtype"`
	Shape     []int64         `json:"shape"`
	Sources   []Source        `json:"sources"`
	Transform *transform.Expr `json:"transform,omitempty"`
	Data      *Location       `json:"data,omitempty"`

	// packed is Transform held flat by a table once lowered (written as
	// Transform is; Expr gives either).
	packed transform.Packed
}

// Expr is the weight's transform of its sources (nil: a source as stored).
func (w *Weight) Expr() *transform.Expr {
	if w.Transform != nil {
		return w.Transform
	}
	return w.packed.Unpack()
}

// Computed reports whether the weight is a transform of its sources (a
// cast, stacked experts), not a source as stored.
func (w *Weight) Computed() bool { return w.Transform != nil || w.packed != nil }

// Bytes is the weight's size as the graph holds it (0 for a dtype
// strata does not know).
func (w *Weight) Bytes() int64 {
	t, err := dtype.Parse(w.DType)
	if err != nil {
		return 0
	}
	return transform.Type{DType: t, Shape: w.Shape}.Bytes()
}

// Source is a checkpoint tensor: Length bytes at absolute byte Offset of
// Files[File], as the safetensors header describes it (its Key, Offset,
// Length, DType and Shape). A table's sources point at the checkpoint's
// own entries rather than copy them: Kimi-K2's 140,000 were 11 MB of
// copies. Marshalled as {"key", "file", "offset", "length", "dtype",
// "shape"}.
type Source struct {
	*checkpoint.Tensor
	File int
}

// NewSource is the source of tensor key in Files[file].
func NewSource(key string, file int, offset, length int64, dtype string, shape []int64) Source {
	return Source{Tensor: &checkpoint.Tensor{Key: key, Offset: offset, Length: length, DType: dtype, Shape: shape}, File: file}
}

// sourceJSON is a Source as the spec writes it.
type sourceJSON struct {
	Key    string  `json:"key"`
	File   int     `json:"file"`
	Offset int64   `json:"offset"`
	Length int64   `json:"length"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
}

func (s Source) MarshalJSON() ([]byte, error) { return appendSource(nil, &s), nil }

func (s *Source) UnmarshalJSON(data []byte) error {
	var j sourceJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*s = NewSource(j.Key, j.File, j.Offset, j.Length, j.DType, j.Shape)
	return nil
}

// Location is a byte range of Files[File].
type Location struct {
	File   int   `json:"file"`
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// Marshal renders the spec as JSON with a trailing newline: its fields one
// per line, and each file and weight on a line of its own. Indenting every
// source too doubled GLM-4.6's spec (17.5 MB, not 9 MB) and its encoding
// time.
func (s *Spec) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(s.sizeHint()) // one buffer, not 32 MB of doublings for GLM-4.6's 9 MB
	if _, err := s.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteTo writes what Marshal returns to w, without holding it whole.
func (s *Spec) WriteTo(w io.Writer) (int64, error) {
	head := *s
	head.Files, head.Weights = nil, nil
	data, err := json.MarshalIndent(head, "", "  ")
	if err != nil {
		return 0, fmt.Errorf("encoding weight spec: %w", err)
	}
	// The lists, written one element a line, replace head's two nulls.
	nulls := []byte(",\n  \"files\": null,\n  \"weights\": null\n}")
	if !bytes.HasSuffix(data, nulls) {
		return 0, fmt.Errorf("encoding weight spec: files and weights are not its last fields")
	}
	cw := &countingWriter{w: w}
	cw.Write(data[:len(data)-len(nulls)])
	cw.Write([]byte(",\n  \"files\": "))
	if err := writeLines(cw, s.Files, appendJSON[File]); err != nil {
		return cw.n, err
	}
	cw.Write([]byte(",\n  \"weights\": "))
	if err := writeLines(cw, s.Weights, appendWeightLine); err != nil {
		return cw.n, err
	}
	cw.Write([]byte("\n}\n"))
	return cw.n, cw.err
}

// countingWriter counts what it writes and keeps the first error (then
// writes nothing more).
type countingWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

// sizeHint guesses the encoded size of the files and weights: about 200
// bytes a source (its key, place and shape) and as much again for the
// expression naming it; a guess, only to size the buffer once.
func (s *Spec) sizeHint() int {
	n := 200 * len(s.Files)
	for _, w := range s.Weights {
		n += 200 + 220*len(w.Sources)
		if w.Transform == nil && w.packed == nil {
			n -= 100 * len(w.Sources)
		}
	}
	return n
}

// writeLines writes list as a JSON array with one element a line, each
// encoded by appendOne.
func writeLines[T any](w *countingWriter, list []T, appendOne func([]byte, *T) ([]byte, error)) error {
	if len(list) == 0 {
		w.Write([]byte("[]"))
		return w.err
	}
	w.Write([]byte("["))
	line := make([]byte, 0, 4096)
	for i := range list {
		line = line[:0]
		if i > 0 {
			line = append(line, ',')
		}
		var err error
		if line, err = appendOne(append(line, "\n    "...), &list[i]); err != nil {
			return fmt.Errorf("encoding weight spec: %w", err)
		}
		if _, err := w.Write(line); err != nil {
			return err
		}
	}
	w.Write([]byte("\n  ]"))
	return w.err
}

// appendJSON is json.Marshal's encoding of v, appended.
func appendJSON[T any](b []byte, v *T) ([]byte, error) {
	data, err := json.Marshal(v)
	return append(b, data...), err
}

// appendWeightLine is appendWeight as writeLines calls it.
func appendWeightLine(b []byte, w *Weight) ([]byte, error) { return appendWeight(b, w), nil }

// Compact renders the spec as one line, for model metadata.
func (s *Spec) Compact() (string, error) {
	head := *s
	head.Weights = nil
	data, err := json.Marshal(head)
	if err != nil {
		return "", fmt.Errorf("encoding weight spec: %w", err)
	}
	if s.Weights == nil {
		return string(data), nil
	}
	// The weights, encoded by hand (appendWeight), replace head's null.
	null := []byte(`"weights":null}`)
	if !bytes.HasSuffix(data, null) {
		return "", fmt.Errorf("encoding weight spec: weights are not its last field")
	}
	b := append(data[:len(data)-len(null)], `"weights":[`...)
	for i := range s.Weights {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendWeight(b, &s.Weights[i])
	}
	return string(append(b, "]}"...)), nil
}

// SpecReference is what model.onnx's metadata holds under MetadataKey instead
// of the whole spec (7.5 MB of Qwen3-235B's 25.4 MB model): which file the
// spec is, relative to the model, its SHA-256, and its counts.
type SpecReference struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	Path    string `json:"path"`
	SHA256  string `json:"sha256"`
	Weights int    `json:"weights"`
	Files   int    `json:"files"`
}

// ReferenceSum renders the metadata value that points at the spec, written
// to path (relative to the model) with the SHA-256 sum.
func (s *Spec) ReferenceSum(path string, sum []byte) (string, error) {
	ref, err := json.Marshal(SpecReference{Format: SpecFormat, Version: SpecVersion, Path: path, SHA256: hex.EncodeToString(sum),
		Weights: len(s.Weights), Files: len(s.Files)})
	return string(ref), err
}

// ParseSpec reads a spec (weight_spec.json or the model metadata value).
func ParseSpec(data []byte) (*Spec, error) {
	var s Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("weight spec: %w", err)
	}
	if s.Format != SpecFormat || s.Version != SpecVersion {
		return nil, fmt.Errorf("weight spec: format %q version %d, want %q version %d", s.Format, s.Version, SpecFormat, SpecVersion)
	}
	return &s, nil
}

// Merge joins the specs of the windows of one model, in order: files in
// order of first use, weights sorted by name. Specs that disagree on
// anything but their files and weights come from different exports.
func Merge(specs []*Spec) (*Spec, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("no weight specs to merge")
	}
	if len(specs) == 1 && merged(specs[0]) {
		return specs[0], nil // what merging it would give
	}
	var m Merger
	for _, s := range specs {
		if err := m.Add(s); err != nil {
			return nil, err
		}
	}
	return m.Spec()
}

// Merger is Merge a spec at a time: it keeps what the merged spec holds,
// so a caller adding windows' specs as they come need not keep them all
// (GLM-4.6-FP8's 93 windows' sources were 10 MB beside their merge).
type Merger struct {
	out     *Spec
	files   map[string]int
	weights map[string]Weight
}

// Add merges s into what was added before.
func (m *Merger) Add(s *Spec) error {
	if m.out == nil {
		out := *s
		out.Files, out.Weights = nil, nil
		m.out, m.files, m.weights = &out, map[string]int{}, map[string]Weight{}
	}
	out := m.out
	if s.Format != out.Format || s.Version != out.Version || s.Producer != out.Producer ||
		s.ModelType != out.ModelType || s.ComputeDType != out.ComputeDType || s.Mode != out.Mode || s.Checkpoint != out.Checkpoint {
		return fmt.Errorf("weight specs of different exports cannot be merged")
	}
	for _, f := range s.Files {
		if _, ok := m.files[f.Path]; !ok {
			m.files[f.Path] = len(out.Files)
			out.Files = append(out.Files, f)
		}
	}
	for _, w := range s.Weights {
		w, err := remap(w, s.Files, m.files)
		if err != nil {
			return err
		}
		if prev, ok := m.weights[w.Name]; ok {
			if !sameWeight(prev, w) {
				return fmt.Errorf("weight %s differs between windows", w.Name)
			}
			continue // a weight two windows share: the first's bytes serve both
		}
		m.weights[w.Name] = w
	}
	return nil
}

// Spec is the merged spec.
func (m *Merger) Spec() (*Spec, error) {
	if m.out == nil {
		return nil, fmt.Errorf("no weight specs to merge")
	}
	out := *m.out
	out.Weights = make([]Weight, 0, len(m.weights))
	for _, w := range m.weights {
		out.Weights = append(out.Weights, w)
	}
	sort.Slice(out.Weights, func(i, j int) bool { return out.Weights[i].Name < out.Weights[j].Name })
	return &out, nil
}

// merged reports whether s is already what Merge makes of it alone: files
// of distinct paths, weights sorted by distinct names, naming files s has
// (else Merge says which does not).
func merged(s *Spec) bool {
	paths := make(map[string]bool, len(s.Files))
	for _, f := range s.Files {
		if paths[f.Path] {
			return false
		}
		paths[f.Path] = true
	}
	inFiles := func(i int) bool { return i >= 0 && i < len(s.Files) }
	for i, w := range s.Weights {
		if i > 0 && s.Weights[i-1].Name >= w.Name || w.Data != nil && !inFiles(w.Data.File) {
			return false
		}
		for _, src := range w.Sources {
			if !inFiles(src.File) {
				return false
			}
		}
	}
	return true
}

// remap rewrites a window's file indices into the merged file list.
func remap(w Weight, from []File, to map[string]int) (Weight, error) {
	index := func(i int) (int, error) {
		if i < 0 || i >= len(from) {
			return 0, fmt.Errorf("weight %s names file %d of %d", w.Name, i, len(from))
		}
		return to[from[i].Path], nil
	}
	w.Sources = append([]Source(nil), w.Sources...)
	for i := range w.Sources {
		var err error
		if w.Sources[i].File, err = index(w.Sources[i].File); err != nil {
			return w, err
		}
	}
	if w.Data != nil {
		d := *w.Data
		var err error
		if d.File, err = index(d.File); err != nil {
			return w, err
		}
		w.Data = &d
	}
	return w, nil
}

// sameWeight compares what two weights are, not where materialised bytes
// were written.
func sameWeight(a, b Weight) bool {
	a.Data, b.Data = nil, nil
	return string(appendWeight(nil, &a)) == string(appendWeight(nil, &b)) // a packed transform as any
}
