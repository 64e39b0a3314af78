package weights

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/quant"
	"github.com/strata-llm/strata/host/weights/transform"
	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"google.golang.org/protobuf/proto"
)

// Weight modes.
const (
	// Reference: initializers are the checkpoint's tensors, referenced in
	// place; transforms are ONNX nodes over them.
	Reference = "reference"
	// Materialize: strata computes each transformed weight in Go and writes
	// it to a safetensors file of the export; initializers reference that.
	Materialize = "materialize"
)

// Modes lists the accepted --weights values.
var Modes = []string{Reference, Materialize}

// Table turns weight bindings into graph values and records the spec. In
// reference mode it adds one initializer per checkpoint tensor, pointing at
// its bytes in the linked shard, and lowers transforms into nodes; in
// materialize mode it adds one initializer per graph weight, whose bytes
// Materialize computes.
type Table struct {
	ckpt    *checkpoint.Checkpoint
	quant   *quant.View // quantised weights: a binding of one is its dequantisation
	compute dtype.DType
	mode    string
	b       *graph.Builder
	byExpr  map[[sha256.Size]byte]string // expression digest -> graph value
	weights map[string]*pending
	order   []string                       // graph values in first-use order
	inits   map[string]*onnxpb.TensorProto // initializers added
	// leaves are the checkpoint tensors referenced as they are stored, by
	// pointer: a map of their names was 5.6 MB of Kimi-K2's heap.
	leaves  map[*checkpoint.Tensor]struct{}
	consts  map[string]*onnxpb.TensorProto // constants of transforms added, by name
	files   map[string]int                 // file path -> index in Files
	byShard map[string]int                 // checkpoint shard name -> index in Files
	Files   []File
	// DataPath is where materialised weights go, relative to the model.
	DataPath string
	// ShardBytes bounds each materialised data file (0: DefaultShardBytes).
	ShardBytes int64
	shards     []dataShard // set by Layout
	scratch    []byte      // for expression digests
}

type pending struct {
	spec Weight
	expr *transform.Expr // until placed, in reference mode (then spec.packed, or the key it names)
}

// sourceTensors are the tensors w reads, each once, found in ckpt where w
// does not hold them (transform.Expr.Stored).
func (w *pending) sourceTensors(ckpt *checkpoint.Checkpoint) []*checkpoint.Tensor {
	find := func(key string) *checkpoint.Tensor { t, _ := ckpt.Tensor(key); return t }
	switch {
	case w.expr != nil:
		keys := w.expr.Keys()
		out := make([]*checkpoint.Tensor, len(keys))
		for i, key := range keys {
			out[i] = find(key)
		}
		return out
	case w.spec.packed != nil:
		return w.spec.packed.Tensors(find)
	}
	return []*checkpoint.Tensor{find(w.spec.Name)} // a tensor as stored is named by its key
}

// NewTable collects the weights of ckpt into b, in mode (Reference or
// Materialize, writing to dataPath).
func NewTable(ckpt *checkpoint.Checkpoint, q *quant.View, compute dtype.DType, b *graph.Builder, mode, dataPath string) *Table {
	return &Table{ckpt: ckpt, quant: q, compute: compute, mode: mode, b: b, DataPath: dataPath,
		byExpr: map[[sha256.Size]byte]string{}, weights: map[string]*pending{}, inits: map[string]*onnxpb.TensorProto{}, leaves: map[*checkpoint.Tensor]struct{}{}, consts: map[string]*onnxpb.TensorProto{}, files: map[string]int{}, byShard: map[string]int{}}
}

// Reserve sizes the table for about n checkpoint tensors (a whole model's):
// grown instead, its index of them was 12 MB of Kimi-K2's allocations.
func (t *Table) Reserve(n int) {
	if len(t.leaves) == 0 {
		t.leaves = make(map[*checkpoint.Tensor]struct{}, n)
	}
}

// Value returns the graph value for a weight binding, adding what it needs
// on first use. name names a computed weight (a transform of tensors);
// plain tensors are named by their key.
func (t *Table) Value(wb *pb.WeightBinding, name string) (string, error) {
	var p Prepared
	p, t.scratch = t.Prepare(wb, t.scratch)
	return t.ValueOf(p, name)
}

// Prepared is a binding's weight expression, checked against the
// checkpoint and digested: what Value computes before it touches the
// table. Assemblers prepare a layer's bindings while they place the one
// before (Kimi-K2's 139,000 expert tensors made Value a fifth of the
// export's CPU).
type Prepared struct {
	expr   *transform.Expr
	digest [sha256.Size]byte
	err    error
}

// Prepare reads the binding; it only reads the table, so any number may
// run beside Value and ValueOf. scratch is reused for the digest and
// returned.
func (t *Table) Prepare(wb *pb.WeightBinding, scratch []byte) (Prepared, []byte) {
	e, err := t.expression(wb)
	if err != nil {
		return Prepared{err: err}, scratch
	}
	p := Prepared{expr: e}
	p.digest, scratch = e.AppendDigest(scratch)
	return p, scratch
}

// ValueOf is Value of a prepared binding.
func (t *Table) ValueOf(p Prepared, name string) (string, error) {
	if p.err != nil {
		return "", p.err
	}
	e, digest := p.expr, p.digest
	if leaf := leafOf(e); leaf != nil {
		name = t.storedKey(leaf.Key, leaf.Stored)
	}
	if e.Op == transform.OpCast {
		name += "::" + e.To
	}
	if v, ok := t.byExpr[digest]; ok {
		return v, nil
	}
	if _, taken := t.weights[name]; taken {
		return "", fmt.Errorf("two different weights are both named %s", name)
	}
	e.EachLeafExpr(func(x *transform.Expr) { // the sources' files, in first-use order
		t.checkpointFile(t.stored(x.Key, x.Stored).Shard)
	})
	w := &pending{expr: e, spec: Weight{Name: name, DType: dtype.Name(e.Type.DType), Shape: e.Type.Shape}}
	if !e.IsLeaf() {
		w.spec.Transform = e
	}
	if err := t.place(w); err != nil {
		return "", err
	}
	if t.mode == Reference { // lowered: what remains is for the spec
		w.spec.Transform, w.spec.packed, w.expr = nil, w.spec.Transform.Pack(t.ckpt.Key), nil
	}
	t.byExpr[digest] = name
	t.weights[name] = w
	t.order = append(t.order, name)
	return name, nil
}

// Placed lets go of what only placing weights needs — the index of
// expressions placed and the quantisation — once every weight is in the
// graph: encoding the model, next, is the export's heap peak (GLM-4.6-FP8:
// 7 MB of canonical expressions).
func (t *Table) Placed() { t.byExpr, t.quant = nil, nil }

// BindingExpr is the weight a binding names: a checkpoint key as stored, or
// an expression over keys; a quantised weight's key stands for its
// dequantisation over the stored tensors.
func BindingExpr(wb *pb.WeightBinding, q *quant.View) (*transform.Expr, error) {
	e := transform.Leaf(wb.GetKey())
	if wb.GetWeight() != nil {
		var err error
		if e, err = transform.FromProto(wb.GetWeight()); err != nil {
			return nil, err
		}
	}
	if err := refuseStoredParts(e, q); err != nil {
		return nil, err
	}
	return q.Expand(e), nil
}

// refuseStoredParts: a plugin binds a quantised weight by its logical key,
// never its packed tensor or a scale (which it is not shown).
func refuseStoredParts(e *transform.Expr, q *quant.View) (err error) {
	e.EachLeaf(func(k string) {
		if err == nil && q.Stored(k) {
			err = fmt.Errorf("tensor %s is part of a quantised weight (its packed values or a scale): bind the weight by its logical key", k)
		}
	})
	return err
}

// expression reads the binding, checks it against the checkpoint, and casts
// the result to the dtype the function wants.
func (t *Table) expression(wb *pb.WeightBinding) (*transform.Expr, error) {
	e, err := BindingExpr(wb, t.quant)
	if err != nil {
		return nil, err
	}
	target := t.compute
	if wb.GetDtype() != "" {
		if target, err = dtype.Parse(wb.GetDtype()); err != nil {
			return nil, err
		}
	}
	if err := e.InferStored(t.find); err != nil {
		return nil, t.located(e, err)
	}
	if t.mode == Reference && t.quant.Quantized() {
		// One in-graph dequantisation per stacked weight, not per expert.
		e = e.HoistDequant()
		if err := e.InferNew(t.lookup); err != nil {
			return nil, t.located(e, err)
		}
	}
	if e.Type.DType != target {
		e = transform.Cast(e, dtype.Name(target))
		if err := e.InferNew(t.lookup); err != nil {
			return nil, t.located(e, err)
		}
	}
	return e, nil
}

// located adds to an expression's error where its tensors are stored.
func (t *Table) located(e *transform.Expr, err error) error {
	var where []string
	for _, key := range e.Keys() {
		if tensor, ok := t.ckpt.Tensor(key); ok {
			where = append(where, fmt.Sprintf("%s in %s", key, tensor.Shard))
		}
	}
	if len(where) == 0 {
		return err
	}
	if len(where) > 3 {
		where = append(where[:3], fmt.Sprintf("and %d more", len(where)-3))
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(where, ", "))
}

// lookup types a checkpoint tensor; its errors name the tensor.
func (t *Table) lookup(key string) (transform.Type, error) {
	_, typ, err := t.find(key)
	return typ, err
}

// find is lookup with the tensor (transform.Find).
func (t *Table) find(key string) (*checkpoint.Tensor, transform.Type, error) {
	tensor, ok := t.ckpt.Tensor(key)
	if !ok {
		return nil, transform.Type{}, fmt.Errorf("tensor %s is bound by the plugin but missing from the checkpoint", key)
	}
	return tensor, transform.TypeOf(tensor), nil
}

// stored is the tensor a leaf holds, else the one key names.
func (t *Table) stored(key string, stored *checkpoint.Tensor) *checkpoint.Tensor {
	if stored == nil {
		stored, _ = t.ckpt.Tensor(key)
	}
	return stored
}

// storedKey is key as the checkpoint spells it (its own string).
func (t *Table) storedKey(key string, stored *checkpoint.Tensor) string {
	if stored != nil {
		return stored.Key
	}
	return t.ckpt.Key(key)
}

// leafOf is e's leaf when e is one, or a cast of one; else nil.
func leafOf(e *transform.Expr) *transform.Expr {
	if e.Op == transform.OpCast {
		e = e.Args[0]
	}
	if e.IsLeaf() {
		return e
	}
	return nil
}

func (t *Table) sources(tensors []*checkpoint.Tensor) []Source {
	out := make([]Source, 0, len(tensors))
	for _, tensor := range tensors {
		out = append(out, Source{Tensor: tensor, File: t.checkpointFile(tensor.Shard)})
	}
	return out
}

// place puts a new weight in the graph: lowered over referenced tensors, or
// as an initializer of materialised bytes.
func (t *Table) place(w *pending) error {
	if t.mode == Materialize {
		t.inits[w.spec.Name] = &onnxpb.TensorProto{Name: w.spec.Name, DataType: int32(w.expr.Type.DType), Dims: w.expr.Type.Shape,
			DataLocation: onnxpb.TensorProto_EXTERNAL}
		t.b.Initializer(t.inits[w.spec.Name])
		return nil
	}
	g := &tableGraph{t: t, prefix: "weights/" + w.spec.Name}
	value, err := w.expr.Lower(g)
	if err != nil {
		return err
	}
	if value != w.spec.Name { // name the result as the spec does
		if g.last == nil || g.last.GetOutput()[0] != value { // a constant: no node of its own
			g.Node("Identity", []string{value})
		}
		g.last.Output[0] = w.spec.Name
	}
	return nil
}

// tableGraph lets transform.Lower add nodes and initializers.
type tableGraph struct {
	t      *Table
	prefix string
	n      int
	last   *onnxpb.NodeProto
}

func (g *tableGraph) Leaf(key string, stored *checkpoint.Tensor) (string, error) {
	t := g.t
	tensor := t.stored(key, stored)
	// The value is named by the checkpoint's own string: the nodes reading
	// it keep the name, and key may be a copy (a scale's name made from
	// its weight's: 4.5 MB of Kimi-K2's heap).
	if _, done := t.leaves[tensor]; done {
		return tensor.Key, nil
	}
	if _, done := t.inits[tensor.Key]; done { // an initializer of that name
		return tensor.Key, nil
	}
	t.leaves[tensor] = struct{}{}
	t.b.ReferencedExternal(tensor.Key, int32(transform.GraphType(transform.TypeOf(tensor).DType)), tensor.Shape,
		t.Files[t.checkpointFile(tensor.Shard)].Path, tensor.Offset, tensor.Length)
	return tensor.Key, nil
}

// Bytes references key's bytes as a UINT8 initializer of shape (the same
// byte range, under its own name).
func (g *tableGraph) Bytes(key string, shape []int64) (string, error) {
	t := g.t
	name := key + "::bytes"
	if _, done := t.inits[name]; done {
		return name, nil
	}
	tensor, _ := t.ckpt.Tensor(key)
	if n := transform.Prod(shape); n != tensor.Length {
		return "", fmt.Errorf("tensor %s holds %d bytes, not %d", key, tensor.Length, n)
	}
	t.inits[name] = nil
	t.b.ReferencedExternal(name, int32(onnxpb.TensorProto_UINT8), shape,
		t.Files[t.checkpointFile(tensor.Shard)].Path, tensor.Offset, tensor.Length)
	return name, nil
}

func (g *tableGraph) Node(op string, inputs []string, attrs ...*onnxpb.AttributeProto) string {
	if op == "Constant" && len(inputs) == 0 && len(attrs) == 1 && attrs[0].GetName() == "value" && attrs[0].GetT() != nil {
		return g.t.constant(attrs[0].GetT())
	}
	g.n++
	out := fmt.Sprintf("%s/%s_%d", g.prefix, op, g.n)
	g.last = &onnxpb.NodeProto{Name: out, OpType: op, Input: inputs, Output: []string{out}, Attribute: attrs}
	g.t.b.Node(g.last)
	return out
}

// constant is a constant the lowering of transforms needs (shapes, axes,
// FP8 code tables) as one Constant node of the graph, named by its
// content: GLM-4.6-FP8's 6,275 Constant nodes were 49 different tensors.
// Named by content, a window's constants are the whole model's, and
// stitching keeps one of each (an equal node computing the same value).
// The graph's initializers stay the checkpoint's tensors alone.
func (t *Table) constant(c *onnxpb.TensorProto) string {
	// Named by the digest of its whole encoding (it has no name yet), so
	// equal names mean equal tensors whatever fields a constant sets.
	enc, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil { // a TensorProto the lowering built: cannot fail
		panic(fmt.Sprintf("weights: encoding a constant: %v", err))
	}
	digest := sha256.Sum256(enc)
	name := constantPrefix + hex.EncodeToString(digest[:8])
	prev, seen := t.consts[name]
	if seen && !proto.Equal(prev, c) { // 64 bits alike: the whole digest
		name = constantPrefix + hex.EncodeToString(digest[:])
		_, seen = t.consts[name]
	}
	if !seen {
		t.consts[name] = c
		t.b.Node(&onnxpb.NodeProto{Name: name, OpType: "Constant", Output: []string{name},
			Attribute: []*onnxpb.AttributeProto{{Name: "value", Type: onnxpb.AttributeProto_TENSOR, T: c}}})
	}
	return name
}

// constantPrefix starts the names of the transforms' constants.
const constantPrefix = "weights/const/"

func external(location string, offset, length int64) []*onnxpb.StringStringEntryProto {
	return []*onnxpb.StringStringEntryProto{
		{Key: "location", Value: location},
		{Key: "offset", Value: strconv.FormatInt(offset, 10)},
		{Key: "length", Value: strconv.FormatInt(length, 10)},
	}
}

func (t *Table) checkpointFile(shard string) int {
	if i, ok := t.byShard[shard]; ok {
		return i
	}
	sh, _ := t.ckpt.Shard(shard)
	i := t.addFile(File{Path: path.Join(DataDir, shard), Kind: KindCheckpoint, Source: shard, Size: sh.Size})
	t.byShard[shard] = i
	return i
}

func (t *Table) addFile(f File) int {
	t.files[f.Path] = len(t.Files)
	t.Files = append(t.Files, f)
	return t.files[f.Path]
}

// Weights lists every graph weight, sorted by name. Their sources are
// found now, not as weights are placed, when the graph is the heap's peak
// (Qwen3-235B-FP8's are 9 MB).
func (t *Table) Weights() []Weight {
	out := make([]Weight, 0, len(t.weights))
	for _, w := range t.weights {
		spec := w.spec
		spec.Sources = t.sources(w.sourceTensors(t.ckpt))
		out = append(out, spec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
