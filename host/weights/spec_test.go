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
	w := Weight{Name: "w", DType: "float32", Shape: []int64{2}, Sources: []Source{{Key: "w", DType: "F32", Shape: []int64{2}, Length: 8}}}
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
