package window

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/weights"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

func TestCut(t *testing.T) {
	cases := map[string]struct {
		layers, size int
		want         []string
	}{
		"one per window":        {4, 1, []string{"0-0", "1-1", "2-2", "3-3"}},
		"divides":               {4, 2, []string{"0-1", "2-3"}},
		"does not divide":       {5, 2, []string{"0-1", "2-3", "4-4"}},
		"larger than the model": {3, 8, []string{"0-2"}},
		"exactly the model":     {3, 3, []string{"0-2"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			spans, err := Cut(tc.layers, tc.size)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range spans {
				got = append(got, s.String())
				if s.Count != int32(tc.layers) {
					t.Errorf("span %s counts %d layers", s, s.Count)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Cut(%d, %d) = %v, want %v", tc.layers, tc.size, got, tc.want)
			}
			if !spans[0].IsFirst() || !spans[len(spans)-1].IsLast() || len(spans) > 1 && (spans[0].IsLast() || spans[1].IsFirst()) {
				t.Errorf("first/last wrong in %v", spans)
			}
		})
	}
	for _, size := range []int{0, -1} {
		if _, err := Cut(4, size); err == nil || !strings.Contains(err.Error(), "at least 1") {
			t.Errorf("Cut(4, %d) error %v", size, err)
		}
	}
	if f := (Span{3, 5, 8}).File(); f != "windows/window_3_5.onnx" {
		t.Errorf("file %s", f)
	}
}

func TestManifestUnchanged(t *testing.T) {
	dir := t.TempDir()
	s := Span{0, 1, 4}
	if err := os.MkdirAll(filepath.Join(dir, Dir), 0o755); err != nil {
		t.Fatal(err)
	}
	data := []byte("window bytes")
	if err := os.WriteFile(filepath.Join(dir, s.File()), data, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir)
	if err != nil || len(m.Windows) != 0 {
		t.Fatalf("a missing manifest: %v, %+v", err, m)
	}
	m.Record(Entry{Span: s.String(), First: 0, Last: 1, File: s.File(), Inputs: "in", Output: Hash(data)})
	if err := m.Save(dirWriter(dir)); err != nil {
		t.Fatal(err)
	}
	if m, err = Load(dir); err != nil {
		t.Fatal(err)
	}
	if !m.Unchanged(dir, s, "in") {
		t.Error("the recorded window is not recognised")
	}
	if m.Unchanged(dir, s, "other inputs") || m.Unchanged(dir, Span{0, 0, 4}, "in") {
		t.Error("a window with other inputs or another span counts as unchanged")
	}
	if err := os.WriteFile(filepath.Join(dir, s.File()), []byte("edited"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m.Unchanged(dir, s, "in") {
		t.Error("an edited window file counts as unchanged")
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err = Load(dir); err == nil || len(m.Windows) != 0 {
		t.Errorf("a corrupt manifest was trusted: %v, %+v", err, m)
	}
}

func TestStitchNeedsTiledWindows(t *testing.T) {
	cases := map[string][]Model{
		"none":     nil,
		"gap":      {{Span: Span{0, 0, 3}}, {Span: Span{2, 2, 3}}},
		"overlap":  {{Span: Span{0, 1, 3}}, {Span: Span{1, 2, 3}}},
		"too few":  {{Span: Span{0, 1, 3}}},
		"unsorted": {{Span: Span{1, 2, 3}}, {Span: Span{0, 0, 3}}},
	}
	for name, ws := range cases {
		t.Run(name, func(t *testing.T) {
			if _, _, err := Stitch(ws, IO{}); err == nil {
				t.Error("stitched windows that do not tile the layers")
			}
		})
	}
}

// dirWriter writes files under a plain directory.
type dirWriter string

func (d dirWriter) WriteFileUnsynced(rel string, data []byte) error {
	return os.WriteFile(filepath.Join(string(d), filepath.FromSlash(rel)), data, 0o644)
}

// A checkpoint tensor two windows both reference is added once; the same
// name pointing at other bytes is refused.
func TestStitchReferencedInitializersOnce(t *testing.T) {
	init := func(offset string) *onnxpb.TensorProto {
		return &onnxpb.TensorProto{Name: "model.embed_tokens.weight", DataType: int32(onnxpb.TensorProto_FLOAT), Dims: []int64{4},
			DataLocation: onnxpb.TensorProto_EXTERNAL, ExternalData: []*onnxpb.StringStringEntryProto{
				{Key: "location", Value: "checkpoint/model.safetensors"}, {Key: "offset", Value: offset}, {Key: "length", Value: "16"}}}
	}
	// A window read back from its file holds the TensorProto; one built in
	// this process holds it encoded (graph.Builder.ReferencedExternal).
	window := func(s Span, offset string, encoded bool) Model {
		spec := &weights.Spec{Format: weights.SpecFormat, Version: weights.SpecVersion, Mode: weights.Reference}
		meta := []*onnxpb.StringStringEntryProto{{Key: weights.MetadataKey}}
		if !encoded {
			return Model{Span: s, Spec: spec, Proto: &onnxpb.ModelProto{Graph: &onnxpb.GraphProto{Initializer: []*onnxpb.TensorProto{init(offset)}}, MetadataProps: meta}}
		}
		b := graph.New("")
		n, _ := strconv.ParseInt(offset, 10, 64)
		b.ReferencedExternal("model.embed_tokens.weight", int32(onnxpb.TensorProto_FLOAT), []int64{4}, "checkpoint/model.safetensors", n, 16)
		m := b.Model(graph.Metadata{})
		m.MetadataProps = meta
		return Model{Span: s, Spec: spec, Proto: m}
	}
	for _, tc := range []struct {
		name, second     string
		first, secondEnc bool
		ok               bool
	}{
		{"same bytes", "8", false, false, true},
		{"other bytes", "24", false, false, false},
		{"same bytes, encoded", "8", true, true, true},
		{"other bytes, encoded", "24", true, true, false},
		{"same bytes, read back then encoded", "8", false, true, true},
		{"other bytes, encoded then read back", "24", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _, err := Stitch([]Model{window(Span{0, 0, 2}, "8", tc.first), window(Span{1, 1, 2}, tc.second, tc.secondEnc)}, IO{})
			if !tc.ok {
				if err == nil || !strings.Contains(err.Error(), "differs from an earlier window's") {
					t.Fatalf("stitched a tensor named twice with other bytes: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			data, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			var back onnxpb.ModelProto
			if err := proto.Unmarshal(data, &back); err != nil {
				t.Fatal(err)
			}
			if got := back.GetGraph().GetInitializer(); len(got) != 1 || !proto.Equal(got[0], init("8")) {
				t.Errorf("stitched initializers %v, want the one once", got)
			}
		})
	}
}
