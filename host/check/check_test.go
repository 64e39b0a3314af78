package check

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/weights"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// writeModel writes a model whose one initializer's data is at loc.
func writeModel(t *testing.T, dir, loc, offset, length string) {
	t.Helper()
	writeModelMeta(t, dir, loc, offset, length, nil)
}

// writeModelMeta is writeModel with metadata.
func writeModelMeta(t *testing.T, dir, loc, offset, length string, meta []*onnxpb.StringStringEntryProto) {
	t.Helper()
	init := &onnxpb.TensorProto{Name: "w", DataType: int32(onnxpb.TensorProto_FLOAT), Dims: []int64{4},
		DataLocation: onnxpb.TensorProto_EXTERNAL, ExternalData: []*onnxpb.StringStringEntryProto{
			{Key: "location", Value: loc}, {Key: "offset", Value: offset}}}
	if length != "" {
		init.ExternalData = append(init.ExternalData, &onnxpb.StringStringEntryProto{Key: "length", Value: length})
	}
	data, err := proto.Marshal(&onnxpb.ModelProto{Graph: &onnxpb.GraphProto{Initializer: []*onnxpb.TensorProto{init},
		Node: []*onnxpb.NodeProto{{OpType: "Identity", Input: []string{"w"}, Output: []string{"y"}}}, Output: []*onnxpb.ValueInfoProto{{Name: "y"}}},
		MetadataProps: meta})
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
		{"a parent path", "../w.bin", "0", "16", "not a clean path inside"},
		{"an absolute path", "/etc/hostname", "0", "1", "not a clean path inside"},
		{"a parent inside the path", "sub/../w.bin", "0", "16", "not a clean path inside"},
		{"an offset past the file", "w.bin", "100", "16", "ends at byte 116"},
		{"an offset that overflows", "w.bin", "9223372036854775800", "16", "overflows"},
		{"a length too small", "w.bin", "0", "8", "need 16 bytes"},
		{"no length", "w.bin", "0", "", "need 16 bytes"},
		{"a negative offset", "w.bin", "-1", "16", "bad external data"},
		{"missing", "nope.bin", "0", "16", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, 16), 0o644); err != nil {
				t.Fatal(err)
			}
			writeModel(t, dir, tc.loc, tc.offset, tc.length)
			wantProblem(t, dir, tc.want)
		})
	}
}

// A model file that holds no graph (empty, zeros, truncated) is broken,
// and a large one is streamed, not held (issue 30: a 3 GB sparse
// model.onnx took 3 GB of memory).
func TestModelsWithoutAGraphAreBroken(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(path string) error
		want string
	}{
		{"empty", func(p string) error { return os.WriteFile(p, nil, 0o644) }, "holds no graph"},
		{"sparse 3 GB", func(p string) error {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return err
			}
			return os.Truncate(p, 3<<30)
		}, "not an ONNX model"},
		{"a graph field longer than the file", func(p string) error {
			return os.WriteFile(p, []byte{7<<3 | 2, 0xff, 0xff, 0x03}, 0o644)
		}, "runs past the end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.make(filepath.Join(dir, "model.onnx")); err != nil {
				t.Fatal(err)
			}
			wantProblem(t, dir, tc.want)
		})
	}
}

// safetensorsFile writes tensors a and b, F32 [4] each, and returns the
// absolute offset of their data.
func safetensorsFile(t *testing.T, path string) int64 {
	t.Helper()
	header := []byte(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}}`)
	data := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	data = append(append(data, header...), make([]byte, 32)...)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return 8 + int64(len(header))
}

// Each reference is held against the data file's own safetensors header
// and against the tensor the weight spec names there (issue 30: swapped
// shards of one size passed).
func TestReferencesHeldAgainstHeaderAndSpec(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shift int64  // bytes past tensor a's start
		key   string // the spec's source key; "" for no spec
		dtype string
		want  string
	}{
		{"as the spec says", 0, "a", "F32", ""},
		{"no spec: the header alone", 0, "", "", ""},
		{"tensor b where the spec says a", 16, "a", "F32", "where the weight spec says a"},
		{"another dtype in the spec", 0, "a", "BF16", "where the weight spec says a (BF16"},
		{"a range that is no tensor", 4, "", "", "no tensor of that file's safetensors header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			data := safetensorsFile(t, filepath.Join(dir, "w.safetensors"))
			offset := data + tc.shift
			var meta []*onnxpb.StringStringEntryProto
			if tc.key != "" {
				sp := &weights.Spec{Format: weights.SpecFormat, Version: weights.SpecVersion,
					Files: []weights.File{{Path: "w.safetensors", Kind: weights.KindCheckpoint, Size: data + 32}},
					Weights: []weights.Weight{{Name: "w", DType: "float32", Shape: []int64{4},
						Sources: []weights.Source{weights.NewSource(tc.key, 0, offset, 16, tc.dtype, []int64{4})}}}}
				value, err := sp.Marshal()
				if err != nil {
					t.Fatal(err)
				}
				meta = append(meta, &onnxpb.StringStringEntryProto{Key: weights.MetadataKey, Value: string(value)})
			}
			writeModelMeta(t, dir, "w.safetensors", strconv.FormatInt(offset, 10), "16", meta)
			wantProblem(t, dir, tc.want)
		})
	}
}

// wantProblem checks dir: broken, with a problem saying want, or ("") not.
func wantProblem(t *testing.T, dir, want string) {
	t.Helper()
	r, err := Dir(dir)
	if err != nil {
		t.Fatal(err)
	}
	problems := strings.Join(r.Models[0].Problems, "; ")
	if r.Broken != (want != "") || !strings.Contains(problems, want) {
		t.Errorf("broken %v, problems %q, want %q", r.Broken, problems, want)
	}
}
