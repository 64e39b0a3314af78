package weights

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/graph"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// source writes a small checkpoint: three BF16 experts, an F32 norm, U8 codes,
// each a repeated byte.
func source(t *testing.T) *checkpoint.Checkpoint {
	return checkpointOf(t, []checkpoint.Entry{
		{Name: "experts.0.w", DType: "BF16", Shape: []int64{2, 3}},
		{Name: "experts.1.w", DType: "BF16", Shape: []int64{2, 3}},
		{Name: "experts.2.w", DType: "BF16", Shape: []int64{2, 3}},
		{Name: "norm", DType: "F32", Shape: []int64{3}},
		{Name: "codes", DType: "U8", Shape: []int64{4}},
	}, func(i int, data []byte) {
		for j := range data {
			data[j] = byte(0x3f + i)
		}
	})
}

// checkpointOf writes a one-file checkpoint of entries, fill giving the
// bytes of entry i, and opens it.
func checkpointOf(t *testing.T, entries []checkpoint.Entry, fill func(i int, data []byte)) *checkpoint.Checkpoint {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.safetensors")
	w, err := checkpoint.CreateSafetensors(path, entries)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range entries {
		n := map[string]int64{"BF16": 2, "F32": 4, "U8": 1}[e.DType]
		for _, d := range e.Shape {
			n *= d
		}
		data := make([]byte, n)
		fill(i, data)
		if err := w.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := checkpoint.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func stackBinding(input string) *pb.WeightBinding {
	return &pb.WeightBinding{Input: input, Weight: weight.Stack(0,
		weight.Tensor("experts.0.w"), weight.Tensor("experts.1.w"), weight.Tensor("experts.2.w")).Proto()}
}

func TestTableNamesDedupesAndRecords(t *testing.T) {
	for _, mode := range Modes {
		t.Run(mode, func(t *testing.T) {
			b := graph.New("g")
			tab := NewTable(source(t), nil, onnxpb.TensorProto_FLOAT, b, mode, "weights/model.safetensors")
			cases := []struct {
				wb   *pb.WeightBinding
				name string
				want string
			}{
				{&pb.WeightBinding{Key: "norm"}, "layers.0/norm", "norm"},
				{&pb.WeightBinding{Key: "experts.0.w"}, "layers.0/w", "experts.0.w::float32"},
				{stackBinding("experts"), "layers.0/mlp.experts", "layers.0/mlp.experts::float32"},
				{stackBinding("experts"), "layers.1/mlp.experts", "layers.0/mlp.experts::float32"}, // same weight, same value
				{&pb.WeightBinding{Key: "norm", Dtype: "float16"}, "layers.0/n16", "norm::float16"},
			}
			for _, c := range cases {
				got, err := tab.Value(c.wb, c.name)
				if err != nil || got != c.want {
					t.Errorf("Value(%v) = %q, %v; want %q", c.wb, got, err, c.want)
				}
			}
			if err := tab.Layout(); err != nil {
				t.Fatal(err)
			}
			ws := tab.Weights()
			if len(ws) != 4 {
				t.Fatalf("%d weights, want 4", len(ws))
			}
			for _, w := range ws {
				if w.Name == "layers.0/mlp.experts::float32" {
					if len(w.Sources) != 3 || w.Expr() == nil || w.DType != "float32" || len(w.Shape) != 3 || w.Shape[0] != 3 {
						t.Errorf("stacked weight recorded as %+v", w)
					}
				}
				if (mode == Materialize) != (w.Data != nil) {
					t.Errorf("%s: data location %+v in mode %s", w.Name, w.Data, mode)
				}
			}
		})
	}
}

func TestTableErrorsNameTensorAndFile(t *testing.T) {
	tab := NewTable(source(t), nil, onnxpb.TensorProto_FLOAT, graph.New("g"), Reference, "")
	cases := map[string]struct {
		wb   *pb.WeightBinding
		want []string
	}{
		"missing":        {&pb.WeightBinding{Key: "nope"}, []string{"tensor nope", "missing from the checkpoint"}},
		"bytes as float": {&pb.WeightBinding{Key: "codes"}, []string{"uint8 tensor cannot be cast", "codes in model.safetensors"}},
		"bad stack": {&pb.WeightBinding{Weight: weight.Stack(0, weight.Tensor("experts.0.w"), weight.Tensor("norm")).Proto()},
			[]string{"argument 1 is float32", "norm in model.safetensors"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := tab.Value(c.wb, "w")
			for _, want := range c.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error %v, want %q", err, want)
				}
			}
		})
	}
}

// dirOutput writes materialised files under a directory.
type dirOutput string

func (d dirOutput) Create(rel string) (checkpoint.Sink, error) {
	return checkpoint.FileSink(filepath.Join(string(d), rel))
}
func (d dirOutput) WriteFile(rel string, data []byte) error {
	return os.WriteFile(filepath.Join(string(d), rel), data, 0o644)
}
func (d dirOutput) Name(rel string) string { return filepath.Join(string(d), rel) }

// materialized binds the weights in tab, lays it out and materialises it into
// a new directory, checking that every byte written was counted.
func materialized(t *testing.T, tab *Table, bindings ...*pb.WeightBinding) string {
	t.Helper()
	for _, wb := range bindings {
		if _, err := tab.Value(wb, "x/"+wb.GetInput()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tab.Layout(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "weights"), 0o755); err != nil {
		t.Fatal(err)
	}
	var counted int64
	if err := tab.Materialize(context.Background(), dirOutput(dir), func(n int64) { counted += n }); err != nil {
		t.Fatal(err)
	}
	if counted != tab.DataBytes() {
		t.Errorf("counted %d bytes, wrote %d", counted, tab.DataBytes())
	}
	return dir
}

// Materialised bytes land exactly where the initializers and spec say, in
// one file or, past ShardBytes, in save_pretrained-named shards with an
// index naming each weight's shard.
func TestMaterializeWritesWhereLayoutSays(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   int64
		files   []string
		sharded bool
	}{
		{"one file", 0, []string{"weights/model.safetensors"}, false},
		{"a shard per weight", 1, []string{"weights/model-00001-of-00002.safetensors", "weights/model-00002-of-00002.safetensors"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := source(t)
			b := graph.New("g")
			tab := NewTable(src, nil, onnxpb.TensorProto_FLOAT, b, Materialize, "weights/model.safetensors")
			tab.ShardBytes = tc.limit
			dir := materialized(t, tab, stackBinding("e"), &pb.WeightBinding{Key: "norm"})
			want := tc.files
			if tc.sharded {
				want = append(slices.Clone(want), "weights/model.safetensors.index.json")
			}
			if got := tab.DataFiles(); !slices.Equal(got, want) {
				t.Fatalf("data files %v, want %v", got, want)
			}
			where := map[string]string{} // weight -> file
			for _, f := range tc.files {
				written, err := checkpoint.OpenFile(filepath.Join(dir, f))
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range written.Keys() {
					where[k] = f
				}
			}
			for _, w := range tab.Weights() {
				f := tab.Files[w.Data.File].Path
				written, _ := checkpoint.OpenFile(filepath.Join(dir, f))
				got, ok := written.Tensor(w.Name)
				if !ok || got.Offset != w.Data.Offset || got.Length != w.Data.Length || where[w.Name] != f {
					t.Errorf("%s: written at %+v in %s, spec says %+v in %s", w.Name, got, where[w.Name], w.Data, f)
				}
			}
			for _, init := range b.Model(graph.Metadata{}).GetGraph().GetInitializer() {
				ext := map[string]string{}
				for _, e := range init.GetExternalData() {
					ext[e.GetKey()] = e.GetValue()
				}
				if ext["location"] != where[init.GetName()] || ext["offset"] == "" {
					t.Errorf("initializer %s: %v, written in %s", init.GetName(), ext, where[init.GetName()])
				}
			}
			if !tc.sharded {
				return
			}
			var idx struct {
				Metadata  map[string]int64  `json:"metadata"`
				WeightMap map[string]string `json:"weight_map"`
			}
			data, err := os.ReadFile(filepath.Join(dir, tab.IndexPath()))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(data, &idx); err != nil {
				t.Fatal(err)
			}
			for name, f := range where {
				if "weights/"+idx.WeightMap[name] != f {
					t.Errorf("index puts %s in %s, it is in %s", name, idx.WeightMap[name], f)
				}
			}
			if idx.Metadata["total_size"] != tab.DataBytes() {
				t.Errorf("index total_size %d, want %d", idx.Metadata["total_size"], tab.DataBytes())
			}
			if p, ok := IndexOf(tc.files[0]); !ok || p != tab.IndexPath() {
				t.Errorf("IndexOf(%s) = %s %v", tc.files[0], p, ok)
			}
		})
	}
}

// A weight is written part by part (the arguments of a stack or concat along
// the first axis), a part that is casts and reshapes of one tensor a slice at
// a time; its bytes are those of the weight computed whole, whatever the
// slice's size.
func TestMaterializeInSlicesIsMaterializeWhole(t *testing.T) {
	seed := byte(1)
	src := checkpointOf(t, []checkpoint.Entry{
		{Name: "head", DType: "BF16", Shape: []int64{7, 5}},
		{Name: "norm", DType: "F32", Shape: []int64{9}},
		{Name: "experts.0.w", DType: "BF16", Shape: []int64{2, 3}},
		{Name: "experts.1.w", DType: "BF16", Shape: []int64{2, 3}},
		{Name: "experts.2.w", DType: "BF16", Shape: []int64{2, 3}},
	}, func(_ int, data []byte) {
		for i := range data {
			seed = seed*73 + 41
			data[i] = seed & 0x7e // finite values, no NaN patterns
		}
	})
	materialize := func(slice int64) {
		t.Helper()
		defer func(old int64) { sliceBytes = old }(sliceBytes)
		sliceBytes = slice
		tab := NewTable(src, nil, onnxpb.TensorProto_FLOAT, graph.New("g"), Materialize, "weights/model.safetensors")
		experts := func(f func(weight.Expr) weight.Expr) []weight.Expr {
			return []weight.Expr{f(weight.Tensor("experts.0.w")), f(weight.Tensor("experts.1.w")), f(weight.Tensor("experts.2.w"))}
		}
		same := func(e weight.Expr) weight.Expr { return e }
		transposed := func(e weight.Expr) weight.Expr { return weight.Transpose(e, 1, 0) }
		dir := materialized(t, tab, &pb.WeightBinding{Key: "head"}, &pb.WeightBinding{Key: "norm"}, stackBinding("e"),
			&pb.WeightBinding{Input: "t", Weight: weight.Stack(0, experts(transposed)...).Proto()},
			&pb.WeightBinding{Input: "c", Weight: weight.Concat(1, experts(same)...).Proto()},
			&pb.WeightBinding{Input: "r", Weight: weight.Reshape(weight.Concat(0, experts(same)...), 3, 6).Proto()},
			// as the MoE plugins bind experts: [E, out, in] turned to [E, in, out]
			&pb.WeightBinding{Input: "m", Weight: weight.Transpose(weight.Stack(0, experts(same)...), 0, 2, 1).Proto()},
			&pb.WeightBinding{Input: "n", Weight: weight.Transpose(weight.Concat(0, experts(same)...), 1, 0).Proto()})
		written, err := checkpoint.OpenFile(filepath.Join(dir, "weights/model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if len(written.Keys()) != 8 {
			t.Fatalf("materialised %d weights, want 8", len(written.Keys()))
		}
		for _, k := range written.Keys() {
			got, err := written.ReadTensor(k)
			if err != nil {
				t.Fatal(err)
			}
			whole, err := tab.weights[k].expr.Eval(src.ReadTensor)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, whole.Bytes) {
				t.Errorf("slices of %d bytes: %s differs from the weight computed whole", slice, k)
			}
		}
	}
	for _, slice := range []int64{1, 4, 12, 30, 1 << 40} {
		materialize(slice)
	}
}

// The constants transforms lower to (here the stacks' target shape) are
// one Constant node named by its content, for every weight that needs it;
// the initializers stay the checkpoint's tensors.
func TestTableSharesConstants(t *testing.T) {
	b := graph.New("g")
	tab := NewTable(source(t), nil, onnxpb.TensorProto_FLOAT, b, Reference, "")
	reversed := &pb.WeightBinding{Input: "experts", Weight: weight.Stack(0,
		weight.Tensor("experts.2.w"), weight.Tensor("experts.1.w"), weight.Tensor("experts.0.w")).Proto()}
	for name, wb := range map[string]*pb.WeightBinding{"layers.0/mlp.experts": stackBinding("experts"), "layers.1/mlp.experts": reversed} {
		if _, err := tab.Value(wb, name); err != nil {
			t.Fatal(err)
		}
	}
	m := b.Model(graph.Metadata{})
	var constants []string
	for _, n := range m.GetGraph().GetNode() {
		if n.GetOpType() == "Constant" {
			constants = append(constants, n.GetOutput()[0])
		}
	}
	readers := 0
	for _, n := range m.GetGraph().GetNode() {
		if len(constants) == 1 && slices.Contains(n.GetInput(), constants[0]) {
			readers++
		}
	}
	if len(constants) != 1 || !strings.HasPrefix(constants[0], constantPrefix) || readers != 2 {
		t.Errorf("constants %v read by %d nodes; want one, read by both stacks' Reshape", constants, readers)
	}
	for _, init := range m.GetGraph().GetInitializer() {
		if strings.HasPrefix(init.GetName(), constantPrefix) {
			t.Errorf("initializer %s: the initializers are the checkpoint's tensors", init.GetName())
		}
	}
}
