package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// writeModel writes a model whose one initializer's data is at loc.
func writeModel(t *testing.T, dir, loc, offset, length string) {
	t.Helper()
	init := &onnxpb.TensorProto{Name: "w", DataType: int32(onnxpb.TensorProto_FLOAT), Dims: []int64{4},
		DataLocation: onnxpb.TensorProto_EXTERNAL, ExternalData: []*onnxpb.StringStringEntryProto{
			{Key: "location", Value: loc}, {Key: "offset", Value: offset}, {Key: "length", Value: length}}}
	data, err := proto.Marshal(&onnxpb.ModelProto{Graph: &onnxpb.GraphProto{Initializer: []*onnxpb.TensorProto{init}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.onnx"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestHostileLocationsAreProblems(t *testing.T) {
	for _, tc := range []struct {
		name, loc, offset, length, want string
	}{
		{"in bounds", "w.bin", "0", "16", ""},
		{"past the end", "w.bin", "8", "16", "ends at byte 24"},
		{"a parent path", "../w.bin", "0", "16", "not a path inside"},
		{"an absolute path", "/etc/hostname", "0", "1", "not a path inside"},
		{"a negative offset", "w.bin", "-1", "16", "bad external data"},
		{"missing", "nope.bin", "0", "16", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, 16), 0o644); err != nil {
				t.Fatal(err)
			}
			writeModel(t, dir, tc.loc, tc.offset, tc.length)
			r, err := Dir(dir)
			if err != nil {
				t.Fatal(err)
			}
			problems := strings.Join(r.Models[0].Problems, "; ")
			if r.Broken != (tc.want != "") || !strings.Contains(problems, tc.want) {
				t.Errorf("broken %v, problems %q, want %q", r.Broken, problems, tc.want)
			}
		})
	}
}
