package checkpoint

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"sync"

	"github.com/valyala/fastjson"

	"github.com/strata-llm/strata/sdk/dtype"
)

// maxHeaderBytes bounds a safetensors header; real ones are well under 10 MB
// even for 36k-tensor MoE shards. A larger length means a corrupt file.
const maxHeaderBytes = 100 << 20

// maxElements keeps elements × bits per element (at most 64) inside int64,
// so a corrupt shape cannot wrap around to match a small data span.
const maxElements = math.MaxInt64 / 64

// Tensor is one tensor of a checkpoint, located to the byte.
type Tensor struct {
	Key    string
	DType  string // safetensors name: BF16, F32, F8_E4M3, ...
	Shape  []int64
	Shard  string // file name relative to the checkpoint directory
	Offset int64  // absolute byte offset of the data in the shard file
	Length int64  // bytes
}

// Elements is the number of elements (1 for a scalar).
func (t Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Shard is one safetensors file.
type Shard struct {
	Name        string // relative to the checkpoint directory
	Path        string // absolute, symlinks resolved: the file itself (a Hugging Face cache blob)
	Size        int64
	HeaderBytes int64 // 8 + the JSON header length: where tensor data starts
	Tensors     []Tensor
	// Unindexed: a safetensors file beside the index that the index does
	// not name (a standalone mtp.safetensors).
	Unindexed bool
}

// readShard reads and validates the header of the safetensors file at path
// without reading any tensor data. The header is parsed here rather than by
// github.com/nlpodyssey/safetensors because that library needs the whole
// file in memory and rejects F8_E4M3, F8_E5M2 and F8_E8M0 tensors.
func readShard(path, name string, counter *int64) (Shard, error) {
	real, _, err := Resolve(path)
	if err != nil {
		return Shard{}, err
	}
	f, info, err := OpenRegular(real)
	if err != nil {
		return Shard{}, err
	}
	defer f.Close()
	buf, _ := headerBuffers.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	defer headerBuffers.Put(buf)
	header, err := readHeader(f, info.Size(), counter, *buf)
	if err != nil {
		return Shard{}, err
	}
	*buf = header
	sh := Shard{Name: name, Path: real, Size: info.Size(), HeaderBytes: 8 + int64(len(header))}
	if sh.Tensors, err = parseHeader(header, sh); err != nil {
		return Shard{}, err
	}
	return sh, nil
}

// headerBuffers are reused from header to header: nothing parsed points
// into one (parseHeader copies what it keeps out), and a buffer per shard
// was 31 MB of Kimi-K2's allocations.
var headerBuffers sync.Pool

// readHeader reads the header into buf when it is large enough.
func readHeader(r io.ReaderAt, size int64, counter *int64, buf []byte) ([]byte, error) {
	if size < 8 {
		return nil, fmt.Errorf("file is %d bytes, too short to be safetensors (truncated?)", size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	switch {
	case n > maxHeaderBytes:
		return nil, fmt.Errorf("header length %d is implausibly large: not a safetensors file, or corrupt", n)
	case int64(n) > size-8:
		return nil, fmt.Errorf("header length %d runs past the end of the file (%d bytes): the file is truncated or not safetensors", n, size)
	}
	header := buf[:0]
	if uint64(cap(header)) < n {
		header = make([]byte, n)
	}
	header = header[:n]
	if _, err := r.ReadAt(header, 8); err != nil {
		return nil, fmt.Errorf("reading header: %w", err)
	}
	*counter += 8 + int64(n)
	return header, nil
}

// parsers are reused from shard to shard: a fresh fastjson.Parser grows its
// value cache anew for every header (119 MB allocated over GLM-4.6's 144).
// Nothing parsed is kept: keys, dtypes and shapes are copied out.
var parsers parserPool

// parserPool keeps parsers across garbage collections, which empty
// fastjson.ParserPool (a sync.Pool) and had each header after one regrow
// its parser's cache. A parser keeps the cache of the largest document it
// parsed, so the index (a checkpoint's largest) has a parser of its own.
type parserPool struct {
	mu   sync.Mutex
	free []*fastjson.Parser
}

func (p *parserPool) Get() *fastjson.Parser {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		x := p.free[n-1]
		p.free = p.free[:n-1]
		return x
	}
	return &fastjson.Parser{}
}

func (p *parserPool) Put(x *fastjson.Parser) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < 4 {
		p.free = append(p.free, x)
	}
}

// parseHeader reads the JSON header with valyala/fastjson: encoding/json
// took 3.8 ms for one GLM-4.6 shard's header (a Decoder per entry, to refuse
// unknown fields), a third of the export over its 144 shards; fastjson 0.25.
func parseHeader(header []byte, sh Shard) ([]Tensor, error) {
	if err := checkSurrogates(header); err != nil {
		return nil, err
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(header)
	if err != nil {
		return nil, fmt.Errorf("invalid header JSON: %w", err)
	}
	obj, err := v.Object()
	if err != nil {
		return nil, fmt.Errorf("invalid header JSON: the header is %s, not an object", v.Type())
	}
	dataBytes := sh.Size - sh.HeaderBytes
	tensors := make([]Tensor, 0, obj.Len())
	shapes := shapeInterner{}
	obj.Visit(func(k []byte, v *fastjson.Value) {
		if err != nil || string(k) == "__metadata__" {
			return
		}
		var t Tensor
		if t, err = parseEntry(string(k), v, sh, dataBytes); err == nil {
			t.Shape = shapes.intern(t.Shape)
			tensors = append(tensors, t)
		}
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(tensors, func(i, j int) bool { return tensors[i].Key < tensors[j].Key })
	for i := 1; i < len(tensors); i++ {
		if tensors[i].Key == tensors[i-1].Key {
			return nil, fmt.Errorf("tensor %s is in the header twice: the header is corrupt", tensors[i].Key)
		}
	}
	if err := checkOverlaps(tensors); err != nil {
		return nil, err
	}
	return tensors, nil
}

// shapeInterner shares one slice among a header's equal shapes: a shard
// of experts holds thousands of tensors of a few shapes (3.5 MB of
// GLM-4.6-FP8's heap were their copies). A shared shape is capped at its
// length, so an append copies it; nothing writes into a Tensor's shape.
type shapeInterner map[shapeKey][]int64

type shapeKey struct {
	rank int
	dims [4]int64
}

func (in shapeInterner) intern(shape []int64) []int64 {
	if len(shape) > 4 {
		return shape
	}
	k := shapeKey{rank: len(shape)}
	copy(k.dims[:], shape)
	if s, ok := in[k]; ok {
		return s
	}
	shape = shape[:len(shape):len(shape)]
	in[k] = shape
	return shape
}

// parseEntry reads {"dtype": ..., "shape": [...], "data_offsets": [b, e]}
// and checks it against the file.
func parseEntry(key string, v *fastjson.Value, sh Shard, dataBytes int64) (Tensor, error) {
	if err := CheckName(key); err != nil {
		return Tensor{}, err
	}
	t, offsets, err := entryFields(v)
	if err != nil {
		return Tensor{}, fmt.Errorf("tensor %s: invalid header entry: %w", key, err)
	}
	info, ok := dtype.FromSafetensors(t.DType)
	if !ok {
		return Tensor{}, fmt.Errorf("tensor %s: unknown dtype %q", key, t.DType)
	}
	begin, end := offsets[0], offsets[1]
	t.Key, t.Shard, t.Offset, t.Length = key, sh.Name, sh.HeaderBytes+begin, end-begin
	for _, d := range t.Shape {
		if d < 0 {
			return Tensor{}, fmt.Errorf("tensor %s: negative dimension in shape %v", key, t.Shape)
		}
	}
	if !fitsInt64(t.Shape) {
		return Tensor{}, fmt.Errorf("tensor %s: shape %v has too many elements: the header is corrupt", key, t.Shape)
	}
	if begin < 0 || end < begin {
		return Tensor{}, fmt.Errorf("tensor %s: invalid data_offsets [%d, %d]", key, begin, end)
	}
	if want := info.ByteSize(t.Elements()); want != t.Length {
		return Tensor{}, fmt.Errorf("tensor %s: data_offsets span %d bytes, but %s %v needs %d", key, t.Length, t.DType, t.Shape, want)
	}
	if end > dataBytes {
		return Tensor{}, fmt.Errorf("tensor %s: its data ends at byte %d of the data section, but the file holds only %d data bytes: the file is truncated", key, end, dataBytes)
	}
	return t, nil
}

// entryFields reads an entry's three fields, refusing any other.
func entryFields(v *fastjson.Value) (t Tensor, offsets [2]int64, err error) {
	obj, err := v.Object()
	if err != nil {
		return t, offsets, fmt.Errorf("%s, not an object", v.Type())
	}
	obj.Visit(func(k []byte, v *fastjson.Value) {
		if err != nil {
			return
		}
		var field error
		switch string(k) {
		case "dtype":
			var s []byte
			s, field = v.StringBytes()
			t.DType = dtypeName(s)
		case "shape":
			t.Shape, field = int64s(v, -1)
		case "data_offsets":
			var pair []int64
			if pair, field = int64s(v, 2); field == nil {
				offsets = [2]int64(pair)
			}
		default:
			err = fmt.Errorf("unknown field %q", k)
			return
		}
		if field != nil {
			err = fmt.Errorf("%s: %w", k, field)
		}
	})
	return t, offsets, err
}

// int64s reads an array of integers, of length n unless n is negative.
func int64s(v *fastjson.Value, n int) ([]int64, error) {
	items, err := v.Array()
	if err != nil {
		return nil, fmt.Errorf("%s, not an array", v.Type())
	}
	if n >= 0 && len(items) != n {
		return nil, fmt.Errorf("%d numbers, not %d", len(items), n)
	}
	out := make([]int64, len(items))
	for i, item := range items {
		if out[i], err = item.Int64(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fitsInt64 reports whether shape's size in bits, at up to 64 bits per
// element, fits in int64.
func fitsInt64(shape []int64) bool {
	n := int64(1)
	for _, d := range shape {
		if d != 0 && n > maxElements/d {
			return false
		}
		n *= d
	}
	return true
}

func checkOverlaps(ts []Tensor) error {
	// Sorted by pointer, not by copy: the copies were 8 MB of
	// GLM-4.6-FP8's allocations.
	byOffset := make([]*Tensor, len(ts))
	for i := range ts {
		byOffset[i] = &ts[i]
	}
	slices.SortFunc(byOffset, func(a, b *Tensor) int { return cmp.Compare(a.Offset, b.Offset) })
	// Compare with the tensor reaching furthest so far, not the previous
	// one: an empty tensor in between must not hide an overlap.
	reach := &Tensor{}
	for _, cur := range byOffset {
		if cur.Length > 0 && cur.Offset < reach.Offset+reach.Length {
			return fmt.Errorf("tensors %s and %s overlap in the file: the header is corrupt", reach.Key, cur.Key)
		}
		if cur.Offset+cur.Length > reach.Offset+reach.Length {
			reach = cur
		}
	}
	return nil
}

// dtypeName is the dtype s names, held once for the common ones rather
// than once per tensor.
func dtypeName(s []byte) string {
	switch string(s) {
	case "BF16":
		return "BF16"
	case "F32":
		return "F32"
	case "F16":
		return "F16"
	case "U8":
		return "U8"
	case "F8_E4M3":
		return "F8_E4M3"
	case "I64":
		return "I64"
	}
	return string(s)
}

// ReadShard reads and validates the safetensors header of the file at path
// (symlinks resolved; a regular file only), named name in errors, without
// reading tensor data.
func ReadShard(path, name string) (Shard, error) {
	var n int64
	return readShard(path, name, &n)
}
