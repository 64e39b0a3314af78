// Package graph assembles an ONNX model from the part functions plugins
// build: graph inputs and outputs, initializers, and each part placed either
// inlined (its body copied with prefixed names) or, later, as a call.
package graph

import (
	"fmt"
	"sort"
	"strconv"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// IRVersion of the models strata writes (ONNX IR 10, as the Qualcomm
// toolchain writes them).
const IRVersion = 10

// Builder accumulates one model graph.
type Builder struct {
	graph     *onnxpb.GraphProto
	functions map[string]*onnxpb.FunctionProto
	opsets    map[string]int64
	// referenced are initializers of external data kept encoded
	// (Referenced), in chunks: one growing slice was 42 MB of copies for
	// GLM-4.6's 7 MB.
	referenced [][]byte
	spill      *Spill // nil: all chunks stay in memory
	spillErr   error
}

// Chunks of encoded initializers start small (a window of one layer holds
// a few hundred) and double up to the largest size.
const (
	firstChunk = 16 << 10
	lastChunk  = 1 << 20
)

// New starts a graph called name.
func New(name string) *Builder {
	return &Builder{
		graph:     &onnxpb.GraphProto{Name: name},
		functions: map[string]*onnxpb.FunctionProto{},
		opsets:    map[string]int64{},
	}
}

// Dim is one dimension of a declared input or output: a size or a symbol.
type Dim struct {
	Size  int64
	Param string
}

// TensorType is a tensor type with a shape.
func TensorType(elem onnxpb.TensorProto_DataType, dims []Dim) *onnxpb.TypeProto {
	shape := &onnxpb.TensorShapeProto{}
	for _, d := range dims {
		dim := &onnxpb.TensorShapeProto_Dimension{}
		if d.Param != "" {
			dim.Value = &onnxpb.TensorShapeProto_Dimension_DimParam{DimParam: d.Param}
		} else {
			dim.Value = &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: d.Size}
		}
		shape.Dim = append(shape.Dim, dim)
	}
	return &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
		TensorType: &onnxpb.TypeProto_Tensor{ElemType: int32(elem), Shape: shape},
	}}
}

// Input declares a graph input.
func (b *Builder) Input(name string, elem onnxpb.TensorProto_DataType, dims ...Dim) {
	b.graph.Input = append(b.graph.Input, &onnxpb.ValueInfoProto{Name: name, Type: TensorType(elem, dims)})
}

// Output declares a graph output.
func (b *Builder) Output(name string, elem onnxpb.TensorProto_DataType, dims ...Dim) {
	b.graph.Output = append(b.graph.Output, &onnxpb.ValueInfoProto{Name: name, Type: TensorType(elem, dims)})
}

// Initializer adds a constant tensor (usually one referencing checkpoint bytes).
func (b *Builder) Initializer(t *onnxpb.TensorProto) {
	b.graph.Initializer = append(b.graph.Initializer, t)
}

// graphInitializerField is GraphProto.initializer's field number.
const graphInitializerField = 5

// Referenced adds an initializer of external data (a checkpoint tensor
// referenced in place), kept as its encoding: GLM-4.6's 44,689 of them
// were 28 MB of TensorProtos, and are 7 MB encoded. They become the
// graph's unknown fields, which proto.Marshal writes as they are: in the
// encoded model they are initializers like any other (after the graph's
// outputs); in the ModelProto Model returns they are not in Initializer.
// It returns t's encoding, for a caller that compares initializers by it.
func (b *Builder) Referenced(t *onnxpb.TensorProto) ([]byte, error) {
	opts := proto.MarshalOptions{Deterministic: true}
	chunk := b.record(opts.Size(t))
	start := len(chunk)
	chunk, err := opts.MarshalAppend(chunk, t)
	if err != nil {
		return nil, fmt.Errorf("initializer %s: %w", t.GetName(), err)
	}
	b.referenced[len(b.referenced)-1] = chunk
	return chunk[start:], nil
}

// ReferencedExternal is Referenced for the TensorProto {name, dataType,
// dims, external data at offset, length of location}, encoded by hand:
// the bytes proto.Marshal gives (TestReferencedExternalEncodesAsMarshal),
// in 510 ns where building and marshalling the TensorProto took 2,000.
func (b *Builder) ReferencedExternal(name string, dataType int32, dims []int64, location string, offset, length int64) {
	// The entries' values are decimal strings, appended in place (their
	// strings were 280,000 allocations of Kimi-K2's export).
	type entry struct {
		key, value string
		number     int64 // the value, in decimal, when numeric
		numeric    bool
	}
	entries := [3]entry{{"location", location, 0, false}, {"offset", "", offset, true}, {"length", "", length, true}}
	valueSize := func(e entry) int {
		if e.numeric {
			return decimalDigits(e.number)
		}
		return len(e.value)
	}
	entrySize := func(e entry) int {
		n := protowire.SizeTag(1) + protowire.SizeBytes(len(e.key))
		if v := valueSize(e); v > 0 { // proto3 leaves an empty string out
			n += protowire.SizeTag(2) + protowire.SizeBytes(v)
		}
		return n
	}
	size := protowire.SizeTag(2) + protowire.SizeVarint(uint64(dataType)) +
		protowire.SizeTag(8) + protowire.SizeBytes(len(name)) +
		protowire.SizeTag(14) + protowire.SizeVarint(uint64(onnxpb.TensorProto_EXTERNAL))
	for _, d := range dims { // unpacked, as proto.Marshal writes them
		size += protowire.SizeTag(1) + protowire.SizeVarint(uint64(d))
	}
	for _, e := range entries {
		size += protowire.SizeTag(13) + protowire.SizeBytes(entrySize(e))
	}
	c := b.record(size)
	for _, d := range dims {
		c = protowire.AppendTag(c, 1, protowire.VarintType)
		c = protowire.AppendVarint(c, uint64(d))
	}
	c = protowire.AppendTag(c, 2, protowire.VarintType)
	c = protowire.AppendVarint(c, uint64(dataType))
	c = protowire.AppendTag(c, 8, protowire.BytesType)
	c = protowire.AppendString(c, name)
	for _, e := range entries {
		c = protowire.AppendTag(c, 13, protowire.BytesType)
		c = protowire.AppendVarint(c, uint64(entrySize(e)))
		c = protowire.AppendTag(c, 1, protowire.BytesType)
		c = protowire.AppendString(c, e.key)
		if valueSize(e) == 0 {
			continue
		}
		c = protowire.AppendTag(c, 2, protowire.BytesType)
		c = protowire.AppendVarint(c, uint64(valueSize(e)))
		if e.numeric {
			c = strconv.AppendInt(c, e.number, 10)
		} else {
			c = append(c, e.value...)
		}
	}
	c = protowire.AppendTag(c, 14, protowire.VarintType)
	c = protowire.AppendVarint(c, uint64(onnxpb.TensorProto_EXTERNAL))
	b.referenced[len(b.referenced)-1] = c
}

// decimalDigits is len(strconv.FormatInt(n, 10)).
func decimalDigits(n int64) int {
	digits := 1
	if n < 0 {
		digits++ // the sign; -n may overflow, so count on n
		for n <= -10 {
			n /= 10
			digits++
		}
		return digits
	}
	for n >= 10 {
		n /= 10
		digits++
	}
	return digits
}

// ReferencedEncoded is Referenced for an initializer already encoded (as
// EncodedReferenced gives them): its bytes are copied as they are, and the
// copy returned.
func (b *Builder) ReferencedEncoded(raw []byte) []byte {
	c := b.record(len(raw))
	start := len(c)
	c = append(c, raw...)
	b.referenced[len(b.referenced)-1] = c
	return c[start:]
}

// EncodedReferenced calls fn with the name and encoding of each initializer
// the model (as Model returned it) holds encoded, in order, then lets the
// encodings go from the model. name is a slice of raw, valid during the call.
func EncodedReferenced(m *onnxpb.ModelProto, fn func(name, raw []byte) error) error {
	g := m.GetGraph()
	if g == nil {
		return nil
	}
	if err := eachEncoded(g.ProtoReflect().GetUnknown(), fn); err != nil {
		return fmt.Errorf("graph %s: %w", g.GetName(), err)
	}
	g.ProtoReflect().SetUnknown(nil)
	return nil
}

// EachEncoded is EncodedReferenced for initializers held apart from their
// model (ModelHeld), read in place: a window's, stitched without joining
// its chunks first (17 MB of GLM-4.6-FP8's allocations). A record never
// spans two chunks; a spilled Held is refused.
func EachEncoded(h Held, fn func(name, raw []byte) error) error {
	if h.err != nil {
		return h.err
	}
	if h.spilled > 0 {
		return fmt.Errorf("encoded initializers spilled to a file cannot be read in place")
	}
	for _, c := range h.chunks {
		if err := eachEncoded(c, fn); err != nil {
			return err
		}
	}
	return nil
}

// eachEncoded walks a run of encoded GraphProto.initializer fields.
func eachEncoded(fields []byte, fn func(name, raw []byte) error) error {
	for len(fields) > 0 {
		num, typ, n := protowire.ConsumeTag(fields)
		if n < 0 || num != graphInitializerField || typ != protowire.BytesType {
			return fmt.Errorf("an unknown field that is not an encoded initializer")
		}
		raw, m := protowire.ConsumeBytes(fields[n:])
		if m < 0 {
			return fmt.Errorf("a truncated encoded initializer")
		}
		fields = fields[n+m:]
		name, err := tensorName(raw)
		if err != nil {
			return err
		}
		if err := fn(name, raw); err != nil {
			return err
		}
	}
	return nil
}

// tensorName reads TensorProto.name (field 8) from an encoded tensor.
func tensorName(raw []byte) ([]byte, error) {
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return nil, fmt.Errorf("a malformed encoded initializer")
		}
		raw = raw[n:]
		if num == 8 && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(raw)
			if m < 0 {
				return nil, fmt.Errorf("a malformed encoded initializer")
			}
			return v, nil
		}
		m := protowire.ConsumeFieldValue(num, typ, raw)
		if m < 0 {
			return nil, fmt.Errorf("a malformed encoded initializer")
		}
		raw = raw[m:]
	}
	return nil, fmt.Errorf("an encoded initializer without a name")
}

// Unreference takes back the initializer the last Referenced added (its
// encoding is raw).
func (b *Builder) Unreference(raw []byte) {
	last := len(b.referenced) - 1
	n := len(raw) + protowire.SizeTag(graphInitializerField) + protowire.SizeVarint(uint64(len(raw)))
	b.referenced[last] = b.referenced[last][:len(b.referenced[last])-n]
}

// record starts an initializer of size encoded bytes: the last chunk with
// the field's tag and length appended, and room for the bytes.
func (b *Builder) record(size int) []byte {
	c := b.chunk(protowire.SizeTag(graphInitializerField) + protowire.SizeBytes(size))
	c = protowire.AppendTag(c, graphInitializerField, protowire.BytesType)
	return protowire.AppendVarint(c, uint64(size))
}

// chunk is the last chunk of encoded initializers, with room for n bytes
// more (a new chunk when it has not).
func (b *Builder) chunk(n int) []byte {
	if last := len(b.referenced) - 1; last >= 0 && cap(b.referenced[last])-len(b.referenced[last]) >= n {
		return b.referenced[last]
	}
	size := firstChunk
	if last := len(b.referenced) - 1; last >= 0 {
		size = min(2*cap(b.referenced[last]), lastChunk)
	}
	if b.spill != nil && size == lastChunk && b.spillErr == nil {
		if reuse := b.spillChunks(); cap(reuse) >= n {
			b.referenced = append(b.referenced, reuse)
			return reuse
		}
	}
	b.referenced = append(b.referenced, newChunk(n, size))
	return b.referenced[len(b.referenced)-1]
}

// chunkPools recycle chunks of encoded initializers by size, firstChunk<<i:
// a window's, once stitched (Held.Recycle), serve the windows built after
// it (with the spill's reuse, Kimi-K2 layerwise allocated 48 → 3 MB of
// chunks, each zeroed).
var chunkPools [chunkClasses]sync.Pool

const chunkClasses = 7 // firstChunk, twice that, ... lastChunk

// newChunk is an empty chunk of size bytes (a recycled one when there is
// one), or of n when n is more.
func newChunk(n, size int) []byte {
	if i := chunkClass(size); i >= 0 && n <= size {
		if c, ok := chunkPools[i].Get().(*[]byte); ok {
			return (*c)[:0]
		}
	}
	return make([]byte, 0, max(n, size))
}

// chunkClass is the index of size in chunkPools, or -1.
func chunkClass(size int) int {
	for i := range chunkClasses {
		if firstChunk<<i == size {
			return i
		}
	}
	return -1
}

// SpillTo makes b write its full chunks of encoded initializers to s
// rather than hold them. A spilled chunk is reused: the bytes Referenced
// returns are valid until the next call.
func (b *Builder) SpillTo(s *Spill) { b.spill = s }

// spillChunks writes the chunks in memory to the spill and lets them go,
// but for the largest, emptied, which it returns for reuse (a fresh 1 MiB
// per chunk was 20 MB of Kimi-K2's allocations, whole, each zeroed and faulted
// in).
func (b *Builder) spillChunks() []byte {
	var reuse []byte
	for _, c := range b.referenced {
		if err := b.spill.write(c); err != nil {
			b.spillErr = err
			return nil
		}
		if cap(c) > cap(reuse) {
			reuse = c
		}
	}
	b.referenced = nil
	return reuse[:0]
}

// Node adds a node of the default domain.
func (b *Builder) Node(n *onnxpb.NodeProto) {
	b.graph.Node = append(b.graph.Node, n)
}

// Import requires domain at version; two different versions are an error.
func (b *Builder) Import(domain string, version int64) error {
	if v, ok := b.opsets[domain]; ok && v != version {
		return fmt.Errorf("opset %q imported at versions %d and %d", domainName(domain), v, version)
	}
	b.opsets[domain] = version
	return nil
}

func domainName(d string) string {
	if d == "" {
		return "ai.onnx"
	}
	return d
}

// AddFunction ships fn with the model. The same function offered twice must
// be identical: two plugins' parts cannot disagree on what CtxScatter means.
func (b *Builder) AddFunction(fn *onnxpb.FunctionProto) error {
	key := fn.GetDomain() + "::" + fn.GetName()
	if prev, ok := b.functions[key]; ok {
		if !proto.Equal(prev, fn) {
			return fmt.Errorf("two different definitions of function %s.%s", fn.GetDomain(), fn.GetName())
		}
		return nil
	}
	for _, op := range fn.GetOpsetImport() {
		if op.GetDomain() == fn.GetDomain() {
			continue
		}
		if err := b.Import(op.GetDomain(), op.GetVersion()); err != nil {
			return fmt.Errorf("function %s: %w", fn.GetName(), err)
		}
	}
	b.functions[key] = fn
	return b.Import(fn.GetDomain(), 1)
}

// Metadata is what the model records about who made it.
type Metadata struct {
	ProducerName, ProducerVersion string
	Props                         map[string]string
}

// Model finishes the graph into a model. Functions, opsets and metadata are
// sorted so the same inputs give the same bytes.
// A Builder that spills (SpillTo) gives its model by ModelHeld only.
func (b *Builder) Model(meta Metadata) *onnxpb.ModelProto {
	if b.spill != nil {
		panic("graph: Model of a Builder that spills its initializers; use ModelHeld")
	}
	m, held := b.ModelHeld(meta)
	data, _ := Hold(m, held) // in memory: no error
	b.referenced = nil
	if len(data) > 0 {
		b.referenced = [][]byte{data}
	}
	return m
}

// Hold puts initializers held apart (ModelHeld) into m's graph, joined
// once (the chunks are let go), and returns what the graph holds.
func Hold(m *onnxpb.ModelProto, held Held) ([]byte, error) {
	data, err := held.bytes()
	if err != nil {
		return nil, err
	}
	if len(data) > 0 {
		m.GetGraph().ProtoReflect().SetUnknown(protoreflect.RawFields(data))
	}
	return data, nil
}

// ModelHeld is Model with the initializers held encoded (Referenced) left
// out of the graph and returned apart, as held, for WriteModel to write:
// Model joins them into one slice, which for GLM-4.6 copied 7.7 MB when the
// heap is fullest.
func (b *Builder) ModelHeld(meta Metadata) (*onnxpb.ModelProto, Held) {
	m := &onnxpb.ModelProto{
		IrVersion:       IRVersion,
		ProducerName:    meta.ProducerName,
		ProducerVersion: meta.ProducerVersion,
		Graph:           b.graph,
	}
	for _, d := range sortedKeys(b.opsets) {
		m.OpsetImport = append(m.OpsetImport, &onnxpb.OperatorSetIdProto{Domain: d, Version: b.opsets[d]})
	}
	for _, k := range sortedKeys(b.functions) {
		m.Functions = append(m.Functions, b.functions[k])
	}
	for _, k := range sortedKeys(meta.Props) {
		m.MetadataProps = append(m.MetadataProps, &onnxpb.StringStringEntryProto{Key: k, Value: meta.Props[k]})
	}
	held := Held{chunks: b.referenced, err: b.spillErr}
	if b.spill != nil {
		held.spill, held.spilled = b.spill.f, b.spill.n
	}
	return m, held
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// InputInfo declares a graph input as given.
func (b *Builder) InputInfo(v *onnxpb.ValueInfoProto) {
	b.graph.Input = append(b.graph.Input, v)
}

// OutputInfo declares a graph output as given.
func (b *Builder) OutputInfo(v *onnxpb.ValueInfoProto) {
	b.graph.Output = append(b.graph.Output, v)
}
