package weights

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// Marshal writes valid JSON that reads back as the same spec, each file and
// weight on a line of its own, for any number of them.
func TestSpecMarshalOneEntryALine(t *testing.T) {
	w := Weight{Name: "w", DType: "float32", Shape: []int64{2}, Sources: []Source{NewSource("w", 0, 0, 8, "F32", []int64{2})}}
	f := File{Path: "checkpoint/model.safetensors", Kind: KindCheckpoint, Size: 16}
	for _, n := range []int{0, 1, 3} {
		s := &Spec{Format: SpecFormat, Version: SpecVersion, Mode: Reference, Files: []File{}, Weights: []Weight{}}
		for range n {
			s.Files, s.Weights = append(s.Files, f), append(s.Weights, w)
		}
		data, err := s.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		var back Spec
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatalf("%d entries: %v\n%s", n, err, data)
		}
		if !reflect.DeepEqual(&back, s) {
			t.Errorf("%d entries: read back as %+v, want %+v", n, back, *s)
		}
		var entries int
		for _, line := range bytes.Split(data, []byte("\n")) {
			if line = bytes.TrimSuffix(bytes.TrimSpace(line), []byte(",")); bytes.HasPrefix(line, []byte(`{"`)) {
				if !json.Valid(line) {
					t.Errorf("%d entries: a line is not one whole entry: %s", n, line)
				}
				entries++
			}
		}
		if entries != 2*n {
			t.Errorf("%d files and weights on %d lines:\n%s", n, entries, data)
		}
	}
}

// Merging one spec gives what merging it with an empty one does: the fast
// path for a spec already merged, the full one otherwise.
func TestMergeOfOneSpec(t *testing.T) {
	files := []File{{Path: "checkpoint/a.safetensors"}, {Path: "checkpoint/b.safetensors"}}
	w := func(name string, file int) Weight {
		return Weight{Name: name, DType: "float32", Sources: []Source{NewSource(name, file, 0, 0, "", nil)}}
	}
	spec := func(files []File, ws ...Weight) *Spec {
		return &Spec{Format: SpecFormat, Version: SpecVersion, Mode: Reference, Files: files, Weights: ws}
	}
	for name, s := range map[string]*Spec{
		"merged":        spec(files, w("a", 0), w("b", 1)),
		"unsorted":      spec(files, w("b", 1), w("a", 0)),
		"repeated name": spec(files, w("a", 0), w("a", 0)),
		"repeated file": spec(append(files, files[0]), w("a", 2), w("b", 1)),
		"no such file":  spec(files, w("a", 0), w("b", 2)),
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Merge([]*Spec{s})
			want, werr := Merge([]*Spec{s, spec(nil)})
			if (err == nil) != (werr == nil) {
				t.Fatalf("merging it alone: %v; with an empty spec: %v", err, werr)
			}
			if err == nil && !reflect.DeepEqual(got, want) {
				t.Errorf("merged alone:\n%+v\nwith an empty spec:\n%+v", got, want)
			}
		})
	}
}
