package weights

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
	"github.com/strata-llm/strata/sdk/dtype"
)

// DefaultShardBytes bounds a materialised data file, as save_pretrained's
// max_shard_size does: a 70B model in float32 is 280 GB, which no one
// wants as one file.
const DefaultShardBytes = 5_000_000_000

// dataShard is one materialised data file: its path and its weights.
type dataShard struct {
	path  string
	names []string
}

// entries are the shard's weights as safetensors entries, in order.
func (t *Table) entries(names []string) []checkpoint.Entry {
	out := make([]checkpoint.Entry, len(names))
	for i, name := range names {
		w := t.weights[name]
		info, _ := dtype.Of(w.expr.Type.DType)
		out[i] = checkpoint.Entry{Name: name, DType: info.Safetensors, Shape: w.expr.Type.Shape}
	}
	return out
}

// split cuts the weights, in first-use order, into files of at most
// ShardBytes of tensor data (a larger weight alone in its file), named as
// save_pretrained names shards: DataPath itself when one file suffices,
// else model-00001-of-0000N.safetensors beside it, with an index.
func (t *Table) split() []dataShard {
	limit := t.ShardBytes
	if limit <= 0 {
		limit = DefaultShardBytes
	}
	var groups [][]string
	var size int64
	for _, name := range t.order {
		n := t.weights[name].expr.Type.Bytes()
		if len(groups) == 0 || size > 0 && size+n > limit {
			groups = append(groups, nil)
			size = 0
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], name)
		size += n
	}
	out := make([]dataShard, len(groups))
	for i, g := range groups {
		out[i] = dataShard{path: t.DataPath, names: g}
		if len(groups) > 1 {
			out[i].path = shardPath(t.DataPath, i, len(groups))
		}
	}
	return out
}

// shardPath is data path dir/name.safetensors's shard i of n:
// dir/name-0000{i+1}-of-0000{n}.safetensors.
func shardPath(dataPath string, i, n int) string {
	dir, base := path.Split(dataPath)
	stem := strings.TrimSuffix(base, ".safetensors")
	return fmt.Sprintf("%s%s-%05d-of-%05d.safetensors", dir, stem, i+1, n)
}

// IndexOf is the index beside data file p when p is a shard of several
// (name-00001-of-00003.safetensors: name.safetensors.index.json).
func IndexOf(p string) (string, bool) {
	m := shardName.FindStringSubmatch(p)
	if m == nil {
		return "", false
	}
	return m[1] + ".safetensors.index.json", true
}

var shardName = regexp.MustCompile(`^(.*)-\d{5}-of-\d{5}\.safetensors$`)

// IndexPath is where the index of a sharded data file goes: the
// safetensors convention, <DataPath>.index.json.
func (t *Table) IndexPath() string { return t.DataPath + ".index.json" }

// Layout fixes, in materialize mode, where each weight's bytes will be in
// the data files, and records it in the initializers and the spec. Call it
// after the last Value; it writes nothing.
func (t *Table) Layout() error {
	if t.mode != Materialize || len(t.order) == 0 {
		return nil
	}
	t.shards = t.split()
	for _, sh := range t.shards {
		l, err := checkpoint.Layout(t.entries(sh.names))
		if err != nil {
			return err
		}
		file := t.addFile(File{Path: sh.path, Kind: KindMaterialized, Size: l.Size})
		for i, name := range sh.names {
			t.inits[name].ExternalData = external(sh.path, l.Offsets[i], l.Sizes[i])
			t.weights[name].spec.Data = &Location{File: file, Offset: l.Offsets[i], Length: l.Sizes[i]}
		}
	}
	return nil
}

// DataFiles are the materialised data files Layout laid out, and the index
// when there is more than one (paths relative to the model).
func (t *Table) DataFiles() []string {
	var out []string
	for _, sh := range t.shards {
		out = append(out, sh.path)
	}
	if len(t.shards) > 1 {
		out = append(out, t.IndexPath())
	}
	return out
}

// DataBytes is the tensor bytes Materialize writes.
func (t *Table) DataBytes() int64 {
	var n int64
	for _, name := range t.order {
		n += t.weights[name].expr.Type.Bytes()
	}
	return n
}

// index is the safetensors index of sharded data files: total size and
// each weight's file (a name relative to the index).
func (t *Table) index() ([]byte, error) {
	idx := struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}{Metadata: map[string]int64{"total_size": t.DataBytes()}, WeightMap: map[string]string{}}
	for _, sh := range t.shards {
		for _, name := range sh.names {
			idx.WeightMap[name] = path.Base(sh.path)
		}
	}
	data, err := json.MarshalIndent(idx, "", "  ")
	return append(data, '\n'), err
}

// Output is where Materialize writes: Create starts a data file (rel to
// the model), committed by the returned sink; WriteFile writes the index;
// Name is a file's name in messages.
type Output interface {
	Create(rel string) (checkpoint.Sink, error)
	WriteFile(rel string, data []byte) error
	Name(rel string) string
}

// Materialize computes every weight in Go from the checkpoint's bytes and
// writes the data files (and their index) through out, holding one part of
// a weight (an expert, or a slice of a cast) and its sources in memory at a
// time; counted, when not nil, sees the bytes as they are written. A file appears only when complete;
// a cancelled ctx stops it between weights.
func (t *Table) Materialize(ctx context.Context, out Output, counted func(int64)) error {
	if t.mode != Materialize || len(t.order) == 0 {
		return nil
	}
	for _, sh := range t.shards {
		if err := t.materializeShard(ctx, sh, out, counted); err != nil {
			return err
		}
	}
	if len(t.shards) < 2 {
		return nil
	}
	idx, err := t.index()
	if err != nil {
		return err
	}
	return out.WriteFile(t.IndexPath(), idx)
}

func (t *Table) materializeShard(ctx context.Context, sh dataShard, out Output, counted func(int64)) error {
	sink, err := out.Create(sh.path)
	if err != nil {
		return err
	}
	w, err := checkpoint.NewWriter(out.Name(sh.path), checkpoint.CancelSink(ctx, sink), t.entries(sh.names))
	if err != nil {
		return err
	}
	if counted == nil {
		counted = func(int64) {}
	}
	for _, name := range sh.names {
		if err := ctx.Err(); err != nil {
			w.Abort()
			return err
		}
		if err := t.materializeWeight(ctx, t.weights[name].expr, w, counted); err != nil {
			w.Abort()
			return fmt.Errorf("materialising %s: %w", name, err)
		}
	}
	return w.Close()
}

// sliceBytes bounds the slice of a weight computed at once when it is an
// element-wise function of one tensor (a cast, the usual case): memory stays
// a few slices whatever the tensor's size, where computing it whole held the
// source and the result (1.2 + 2.5 GB for a 151936×4096 head cast to float32).
var sliceBytes int64 = 16 << 20

// materializeWeight writes e's bytes part by part (transform.Parts: the
// experts of a stack one at a time), each in slices when it allows.
func (t *Table) materializeWeight(ctx context.Context, e *transform.Expr, w *checkpoint.Writer, counted func(int64)) error {
	var written int64
	for _, part := range e.Parts() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := t.materializePart(ctx, part, w, func(n int64) { written += n; counted(n) }); err != nil {
			return err
		}
	}
	if written != e.Type.Bytes() {
		return fmt.Errorf("its parts came to %d bytes, want %d", written, e.Type.Bytes())
	}
	return nil
}

func (t *Table) materializePart(ctx context.Context, e *transform.Expr, w *checkpoint.Writer, counted func(int64)) error {
	leaf, ok := e.ElementwiseLeaf()
	if !ok || e.Type.Bytes() <= sliceBytes || leaf.Type.Bytes()%leaf.Type.Elements() != 0 {
		data, err := e.EvalContext(ctx, t.ckpt.ReadTensor)
		if err == nil {
			err = w.Append(data.Bytes)
		}
		counted(int64(len(data.Bytes)))
		return err
	}
	elems, in := leaf.Type.Elements(), leaf.Type.Bytes()/leaf.Type.Elements()
	step := max(1, sliceBytes/max(in, e.Type.Bytes()/elems))
	buf := make([]byte, min(step, elems)*in)
	for at := int64(0); at < elems; at += step {
		if err := ctx.Err(); err != nil {
			return err
		}
		src := buf[:min(step, elems-at)*in]
		if err := t.ckpt.ReadTensorAt(leaf.Key, src, at*in); err != nil {
			return err
		}
		out := e.EvalElements(src)
		if err := w.Append(out); err != nil {
			return err
		}
		counted(int64(len(out)))
	}
	return nil
}

// Materializing reports whether the table writes data files.
func (t *Table) Materializing() bool { return t.mode == Materialize && len(t.order) > 0 }
