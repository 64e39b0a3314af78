package graph

import (
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// modelGraphField is ModelProto.graph's field number.
const modelGraphField = 7

// WriteModel writes m's deterministic encoding, the bytes proto.Marshal
// gives (TestWriteModelIsMarshal), without building them in one buffer:
// the graph's encoded initializers (Builder.Referenced, the graph's
// unknown fields) are written as they are held, then those held apart
// (Builder.ModelHeld), as if they ended the graph's unknown fields. For
// GLM-4.6 that buffer was 12 MB, allocated when the heap is fullest.
func WriteModel(w io.Writer, m *onnxpb.ModelProto, apart ...[]byte) (int64, error) {
	opts := proto.MarshalOptions{Deterministic: true}
	g := m.GetGraph()
	if g == nil && len(apart) > 0 {
		return 0, fmt.Errorf("encoding the model: initializers held apart from a model without a graph")
	}
	if g == nil {
		data, err := opts.Marshal(m)
		if err != nil {
			return 0, err
		}
		n, err := w.Write(data)
		return int64(n), err
	}
	// The model with an empty graph, and the graph without what it holds
	// encoded (m is changed for the while and restored): fields are written
	// in number order, the unknown ones last.
	m.Graph = &onnxpb.GraphProto{}
	outer, err := opts.Marshal(m)
	m.Graph = g
	if err != nil {
		return 0, err
	}
	held := g.ProtoReflect().GetUnknown()
	g.ProtoReflect().SetUnknown(nil)
	known, err := opts.Marshal(g)
	g.ProtoReflect().SetUnknown(held)
	if err != nil {
		return 0, err
	}
	at, err := emptyGraphAt(outer)
	if err != nil {
		return 0, err
	}
	var header []byte
	header = protowire.AppendTag(header, modelGraphField, protowire.BytesType)
	size := len(known) + len(held)
	for _, c := range apart {
		size += len(c)
	}
	header = protowire.AppendVarint(header, uint64(size))
	parts := append([][]byte{outer[:at], header, known, held}, apart...)
	var total int64
	for _, part := range append(parts, outer[at+2:]) {
		n, err := w.Write(part)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// emptyGraphAt finds the empty graph field (tag, zero length) among the
// top-level fields of an encoded model.
func emptyGraphAt(b []byte) (int, error) {
	for at := 0; at < len(b); {
		num, typ, n := protowire.ConsumeTag(b[at:])
		if n < 0 {
			return 0, fmt.Errorf("encoding the model: %w", protowire.ParseError(n))
		}
		if num == modelGraphField && typ == protowire.BytesType && n == 1 && at+1 < len(b) && b[at+1] == 0 {
			return at, nil
		}
		m := protowire.ConsumeFieldValue(num, typ, b[at+n:])
		if m < 0 {
			return 0, fmt.Errorf("encoding the model: %w", protowire.ParseError(m))
		}
		at += n + m
	}
	return 0, fmt.Errorf("encoding the model: no graph field")
}
