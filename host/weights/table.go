package weights

import (
	"fmt"
	"path"
	"sort"
	"strconv"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Table turns weight bindings into graph values: one initializer per
// checkpoint tensor, referencing its bytes in the linked shard, plus a Cast
// where the graph wants another dtype. It records the spec as it goes.
type Table struct {
	ckpt    *checkpoint.Checkpoint
	compute dtype.DType
	b       *graph.Builder
	values  map[string]Weight // graph value name -> weight
	inits   map[string]bool   // initializers added
	files   map[string]int    // shard name -> index in Files
	Files   []File
}

// NewTable collects weights of ckpt into b.
func NewTable(ckpt *checkpoint.Checkpoint, compute dtype.DType, b *graph.Builder) *Table {
	return &Table{ckpt: ckpt, compute: compute, b: b,
		values: map[string]Weight{}, inits: map[string]bool{}, files: map[string]int{}}
}

// Value returns the graph value holding checkpoint tensor key as want
// ("" for the compute dtype), adding its initializer and cast on first use.
func (t *Table) Value(key, want string) (string, error) {
	target := t.compute
	if want != "" {
		var err error
		if target, err = dtype.Parse(want); err != nil {
			return "", fmt.Errorf("weight %s: %w", key, err)
		}
	}
	tensor, ok := t.ckpt.Tensor(key)
	if !ok {
		return "", fmt.Errorf("tensor %s is bound by the plugin but missing from the checkpoint", key)
	}
	src, _ := dtype.FromSafetensors(tensor.DType) // validated when the header was read
	name := key
	if src.ONNX != target {
		name = key + "::" + dtype.Name(target)
	}
	if _, done := t.values[name]; done {
		return name, nil
	}
	w := t.initializer(tensor, src)
	w.Name = name
	if src.ONNX != target {
		if err := castable(src, target); err != nil {
			return "", fmt.Errorf("tensor %s: %w", key, err)
		}
		t.b.Node(&onnxpb.NodeProto{
			Name: "weights/" + name, OpType: "Cast", Input: []string{key}, Output: []string{name},
			Attribute: []*onnxpb.AttributeProto{{Name: "to", Type: onnxpb.AttributeProto_INT, I: int64(target)}},
		})
		w.Transforms = []Transform{{Op: "cast", To: dtype.Name(target)}}
	}
	t.values[name] = w
	return name, nil
}

// castable allows casts between float types only: an integer or packed
// quantised tensor needs a dequantising transform, not a cast.
func castable(src dtype.Info, to dtype.DType) error {
	switch src.ONNX {
	case onnxpb.TensorProto_FLOAT, onnxpb.TensorProto_FLOAT16, onnxpb.TensorProto_BFLOAT16, onnxpb.TensorProto_DOUBLE:
		return nil
	}
	return fmt.Errorf("dtype %s cannot be cast to %s; it needs a dequantising transform", src.Name, dtype.Name(to))
}

// initializer adds the external-data initializer for tensor once and
// returns its spec entry (without Name and Transforms).
func (t *Table) initializer(tensor *checkpoint.Tensor, src dtype.Info) Weight {
	file := t.file(tensor.Shard)
	w := Weight{Initializer: tensor.Key, File: file, Key: tensor.Key, Offset: tensor.Offset,
		Length: tensor.Length, DType: tensor.DType, Shape: tensor.Shape}
	if t.inits[tensor.Key] {
		return w
	}
	t.inits[tensor.Key] = true
	t.b.Initializer(&onnxpb.TensorProto{
		Name:         tensor.Key,
		DataType:     int32(src.ONNX),
		Dims:         tensor.Shape,
		DataLocation: onnxpb.TensorProto_EXTERNAL,
		ExternalData: []*onnxpb.StringStringEntryProto{
			{Key: "location", Value: t.Files[file].Path},
			{Key: "offset", Value: strconv.FormatInt(tensor.Offset, 10)},
			{Key: "length", Value: strconv.FormatInt(tensor.Length, 10)},
		},
	})
	return w
}

func (t *Table) file(shard string) int {
	if i, ok := t.files[shard]; ok {
		return i
	}
	sh, _ := t.ckpt.Shard(shard)
	t.files[shard] = len(t.Files)
	t.Files = append(t.Files, File{Path: path.Join(DataDir, shard), Source: shard, Size: sh.Size})
	return t.files[shard]
}

// Weights lists every graph weight, sorted by name.
func (t *Table) Weights() []Weight {
	out := make([]Weight, 0, len(t.values))
	for _, w := range t.values {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
