package graph

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Initializers kept encoded are ordinary initializers of the encoded
// model, in the order added, after those added whole; encoding twice gives
// the same bytes.
func TestReferencedInitializersEncodeAsInitializers(t *testing.T) {
	tensor := func(name string) *onnxpb.TensorProto {
		return &onnxpb.TensorProto{Name: name, DataType: int32(onnxpb.TensorProto_BFLOAT16), Dims: []int64{2, 3},
			DataLocation: onnxpb.TensorProto_EXTERNAL, ExternalData: []*onnxpb.StringStringEntryProto{
				{Key: "location", Value: "checkpoint/model.safetensors"}, {Key: "offset", Value: "8"}, {Key: "length", Value: "12"}}}
	}
	b := New("g")
	b.Initializer(tensor("whole"))
	for _, name := range []string{"b", "a"} {
		if _, err := b.Referenced(tensor(name)); err != nil {
			t.Fatal(err)
		}
	}
	b.Node(&onnxpb.NodeProto{OpType: "Identity", Input: []string{"a"}, Output: []string{"y"}})
	m := b.Model(Metadata{})
	if n := len(m.GetGraph().GetInitializer()); n != 1 {
		t.Fatalf("the in-memory model holds %d initializers, want only the one added whole", n)
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back onnxpb.ModelProto
	if err := proto.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	got := back.GetGraph().GetInitializer()
	if len(got) != 3 || len(back.GetGraph().GetNode()) != 1 {
		t.Fatalf("decoded %d initializers and %d nodes, want 3 and 1", len(got), len(back.GetGraph().GetNode()))
	}
	for i, name := range []string{"whole", "b", "a"} {
		if !proto.Equal(got[i], tensor(name)) {
			t.Errorf("initializer %d: %v, want %v", i, got[i], tensor(name))
		}
	}
	again, _ := proto.MarshalOptions{Deterministic: true}.Marshal(b.Model(Metadata{}))
	if string(again) != string(data) {
		t.Error("a second Model encodes differently (the encoded initializers twice?)")
	}
}

// The hand encoding of a checkpoint tensor's initializer is proto.Marshal's,
// byte for byte, for scalars, large offsets and shapes, and any name.
func TestReferencedExternalEncodesAsMarshal(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dataType int32
		dims     []int64
		location string
		offset   int64
		length   int64
	}{
		{"model.layers.0.mlp.experts.12.down_proj.weight", int32(onnxpb.TensorProto_BFLOAT16), []int64{5120, 1536}, "checkpoint/model-00011-of-00144.safetensors", 47225456, 15728640},
		{"scalar", int32(onnxpb.TensorProto_FLOAT), nil, "checkpoint/model.safetensors", 8, 4},
		{"empty", int32(onnxpb.TensorProto_FLOAT), []int64{0}, "checkpoint/m.safetensors", 0, 0},
		{"ünïcode/\"name\"", int32(onnxpb.TensorProto_UINT8), []int64{1 << 40, 1, 3}, "checkpoint/ü.safetensors", 1<<62 - 1, 1 << 41},
		{"digits", int32(onnxpb.TensorProto_FLOAT), []int64{2}, "", 9, 10},
		{"more digits", int32(onnxpb.TensorProto_FLOAT), []int64{2}, "x", 99, 100},
		{"negative", int32(onnxpb.TensorProto_FLOAT), []int64{2}, "x", -1, math.MinInt64},
		{"largest", int32(onnxpb.TensorProto_FLOAT), []int64{2}, "x", math.MaxInt64, 999999999999999999},
	} {
		want := &onnxpb.TensorProto{Name: tc.name, DataType: tc.dataType, Dims: tc.dims, DataLocation: onnxpb.TensorProto_EXTERNAL,
			ExternalData: []*onnxpb.StringStringEntryProto{{Key: "location", Value: tc.location},
				{Key: "offset", Value: strconv.FormatInt(tc.offset, 10)}, {Key: "length", Value: strconv.FormatInt(tc.length, 10)}}}
		byHand, marshalled := New("g"), New("g")
		byHand.ReferencedExternal(tc.name, tc.dataType, tc.dims, tc.location, tc.offset, tc.length)
		if _, err := marshalled.Referenced(want); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(byHand.referenced[0], marshalled.referenced[0]) {
			t.Errorf("%s: encoded by hand\n%x\nproto.Marshal\n%x", tc.name, byHand.referenced[0], marshalled.referenced[0])
		}
	}
}

// EncodedReferenced gives back each encoded initializer by name, in order,
// as its TensorProto's bytes, and lets them go; other unknown fields are
// refused.
func TestEncodedReferencedGivesTheInitializersBack(t *testing.T) {
	b := New("g")
	names := []string{"a", "b.weight", "c"}
	for i, n := range names {
		b.ReferencedExternal(n, int32(onnxpb.TensorProto_FLOAT), []int64{int64(i + 1)}, "checkpoint/x.safetensors", int64(8*i), 4)
	}
	m := b.Model(Metadata{})
	var got []string
	err := EncodedReferenced(m, func(name, raw []byte) error {
		var tp onnxpb.TensorProto
		if err := proto.Unmarshal(raw, &tp); err != nil || tp.GetName() != string(name) {
			t.Errorf("initializer %s: encoding decodes to %q (%v)", name, tp.GetName(), err)
		}
		got = append(got, string(name))
		return nil
	})
	if err != nil || strconv.Quote(strings.Join(got, ",")) != strconv.Quote(strings.Join(names, ",")) {
		t.Fatalf("got %v (%v), want %v", got, err, names)
	}
	if len(m.GetGraph().ProtoReflect().GetUnknown()) != 0 {
		t.Error("the encodings were not let go")
	}
	for _, bad := range [][]byte{{0x08, 0x01}, {0x2a, 0x05, 0x01}, {0x2a, 0x02, 0x10, 0x01}} {
		m := &onnxpb.ModelProto{Graph: &onnxpb.GraphProto{}}
		m.Graph.ProtoReflect().SetUnknown(bad)
		if err := EncodedReferenced(m, func(_, _ []byte) error { return nil }); err == nil {
			t.Errorf("unknown fields %x accepted", bad)
		}
	}
}

// WriteModel writes what proto.Marshal (deterministic) does: with encoded
// initializers, without, and with no graph at all.
func TestWriteModelIsMarshal(t *testing.T) {
	withHeld := func() *onnxpb.ModelProto {
		return heldBuilder(t).Model(Metadata{ProducerName: "strata", ProducerVersion: "v", Props: map[string]string{"k": "v"}})
	}
	plain := func() *onnxpb.ModelProto { return New("g").Model(Metadata{ProducerName: "strata"}) }
	for name, m := range map[string]*onnxpb.ModelProto{"held": withHeld(), "plain": plain(), "no graph": {IrVersion: IRVersion}} {
		t.Run(name, func(t *testing.T) {
			want, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			n, err := WriteModel(&got, m, Held{})
			if err != nil || n != int64(got.Len()) {
				t.Fatalf("wrote %d of %d bytes: %v", n, got.Len(), err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("WriteModel wrote %d bytes unlike proto.Marshal's %d", got.Len(), len(want))
			}
			again, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if !bytes.Equal(again, want) {
				t.Error("WriteModel changed the model")
			}
		})
	}
}

func heldBuilder(t *testing.T) *Builder { return heldBuilderOf(t, New("g"), 3000) }

// heldBuilderOf adds to b a graph with n encoded initializers.
func heldBuilderOf(t *testing.T, b *Builder, n int) *Builder {
	b.Input("x", onnxpb.TensorProto_FLOAT, Dim{Param: "n"})
	b.Output("y", onnxpb.TensorProto_FLOAT, Dim{Param: "n"})
	b.Node(&onnxpb.NodeProto{OpType: "Add", Input: []string{"x", "a"}, Output: []string{"y"}})
	for i := range 200 { // nodes with attributes, written one at a time
		b.Node(&onnxpb.NodeProto{Name: "n" + strconv.Itoa(i), OpType: "Constant", Output: []string{"k" + strconv.Itoa(i)},
			Attribute: []*onnxpb.AttributeProto{{Name: "value", Type: onnxpb.AttributeProto_TENSOR,
				T: &onnxpb.TensorProto{DataType: int32(onnxpb.TensorProto_INT64), Dims: []int64{int64(i % 4)}, Int64Data: make([]int64, i%4)}},
				{Name: "axes", Type: onnxpb.AttributeProto_INTS, Ints: []int64{int64(i), -1}}}})
	}
	b.Initializer(&onnxpb.TensorProto{Name: "c", DataType: int32(onnxpb.TensorProto_FLOAT), Dims: []int64{1}, FloatData: []float32{2}})
	for i := range n { // more than one chunk
		b.ReferencedExternal("a."+strconv.Itoa(i), int32(onnxpb.TensorProto_FLOAT), []int64{int64(i)}, "checkpoint/x.safetensors", int64(4*i), 4)
	}
	if err := b.AddFunction(&onnxpb.FunctionProto{Name: "F", Domain: "d", OpsetImport: []*onnxpb.OperatorSetIdProto{{Version: 17}}}); err != nil {
		t.Fatal(err)
	}
	return b
}

// ModelHeld's model written with its held initializers apart is the model
// Model gives, byte for byte.
func TestModelHeldWritesAsModel(t *testing.T) {
	meta := Metadata{ProducerName: "strata", Props: map[string]string{"k": "v"}}
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(heldBuilder(t).Model(meta))
	if err != nil {
		t.Fatal(err)
	}
	m, held := heldBuilder(t).ModelHeld(meta)
	if len(held.chunks) < 2 {
		t.Fatalf("%d chunks held: the test wants more than one", len(held.chunks))
	}
	var got bytes.Buffer
	if _, err := WriteModel(&got, m, held); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("written apart: %d bytes unlike Model's %d", got.Len(), len(want))
	}
}

// A builder that spills its full chunks to a file writes the model Model
// gives, byte for byte, and keeps only its last chunk in memory.
func TestSpilledWritesAsModel(t *testing.T) {
	meta := Metadata{ProducerName: "strata", Props: map[string]string{"k": "v"}}
	const n = 40000 // ~4 MB encoded: chunks reach their largest size and spill
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(heldBuilderOf(t, New("g"), n).Model(meta))
	if err != nil {
		t.Fatal(err)
	}
	spill := NewSpill(func() (*os.File, error) { return os.CreateTemp(t.TempDir(), "spill") })
	defer spill.Close()
	b := New("g")
	b.SpillTo(spill)
	m, held := heldBuilderOf(t, b, n).ModelHeld(meta)
	if held.spilled == 0 || len(held.chunks) != 1 {
		t.Fatalf("%d bytes spilled, %d chunks in memory: want some spilled and one chunk held", held.spilled, len(held.chunks))
	}
	var got bytes.Buffer
	if _, err := WriteModel(&got, m, held); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("spilled: %d bytes unlike Model's %d", got.Len(), len(want))
	}
	joined, err := Hold(m, held)
	if err != nil || int64(len(joined)) != held.Len() {
		t.Fatalf("Hold read back %d of %d bytes: %v", len(joined), held.Len(), err)
	}
}

// A spill that cannot open its file fails the write, naming why.
func TestSpillErrorFailsTheWrite(t *testing.T) {
	b := New("g")
	b.SpillTo(NewSpill(func() (*os.File, error) { return nil, errors.New("disk gone") }))
	m, held := heldBuilderOf(t, b, 40000).ModelHeld(Metadata{})
	if _, err := WriteModel(io.Discard, m, held); err == nil || !strings.Contains(err.Error(), "disk gone") {
		t.Fatalf("WriteModel: %v, want the spill's error", err)
	}
}

// EachEncoded reads ModelHeld's chunks in place as EncodedReferenced reads
// the joined model: the same initializers, in the same order; a spilled
// Held is refused.
func TestEachEncodedReadsHeldAsJoined(t *testing.T) {
	collect := func(read func(fn func(name, raw []byte) error) error) []string {
		var got []string
		if err := read(func(name, raw []byte) error {
			got = append(got, string(name)+"="+strconv.Itoa(len(raw)))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	m, held := heldBuilder(t).ModelHeld(Metadata{})
	inPlace := collect(func(fn func(name, raw []byte) error) error { return EachEncoded(held, fn) })
	if len(held.chunks) < 2 {
		t.Fatalf("%d chunk(s): the test wants records in more than one", len(held.chunks))
	}
	if _, err := Hold(m, held); err != nil {
		t.Fatal(err)
	}
	joined := collect(func(fn func(name, raw []byte) error) error { return EncodedReferenced(m, fn) })
	if len(inPlace) != 3000 || strings.Join(inPlace, ",") != strings.Join(joined, ",") {
		t.Fatalf("in place %d initializers, joined %d; they differ", len(inPlace), len(joined))
	}
	spill := NewSpill(func() (*os.File, error) { return os.CreateTemp(t.TempDir(), "spill") })
	defer spill.Close()
	b := New("g")
	b.SpillTo(spill)
	_, spilled := heldBuilderOf(t, b, 40000).ModelHeld(Metadata{})
	if err := EachEncoded(spilled, func(_, _ []byte) error { return nil }); err == nil {
		t.Error("a spilled Held was read in place")
	}
}
