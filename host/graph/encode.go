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
// (Builder.ModelHeld, possibly spilled to a file), as if they ended the
// graph's unknown fields, and its nodes one at a time. For GLM-4.6 one
// buffer was 12 MB, and the nodes' another 14 for GLM-4.6-FP8, allocated
// when the heap is fullest.
func WriteModel(w io.Writer, m *onnxpb.ModelProto, apart Held) (int64, error) {
	opts := proto.MarshalOptions{Deterministic: true}
	g := m.GetGraph()
	if g == nil && apart.Len() > 0 {
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
	// The graph's nodes (field 1, so first) are encoded one at a time as
	// they are written; the rest of its known fields in one piece.
	held := g.ProtoReflect().GetUnknown()
	nodes := g.Node
	g.ProtoReflect().SetUnknown(nil)
	g.Node = nil
	rest, err := opts.Marshal(g)
	g.Node = nodes
	g.ProtoReflect().SetUnknown(held)
	if err != nil {
		return 0, err
	}
	at, err := emptyGraphAt(outer)
	if err != nil {
		return 0, err
	}
	size := len(rest) + len(held)
	sizes := make([]int, len(nodes)) // each node's, needed again as it is written
	for i, n := range nodes {
		sizes[i] = opts.Size(n)
		size += nodeFieldSize(sizes[i])
	}
	size += int(apart.Len())
	var header []byte
	header = protowire.AppendTag(header, modelGraphField, protowire.BytesType)
	header = protowire.AppendVarint(header, uint64(size))
	cw := &countWriter{w: w}
	cw.write(outer[:at], header)
	buf := make([]byte, 0, 64<<10)
	for i, n := range nodes {
		buf = protowire.AppendTag(buf[:0], graphNodeField, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(sizes[i]))
		if buf, err = opts.MarshalAppend(buf, n); err != nil {
			return cw.n, err
		}
		cw.write(buf)
	}
	cw.write(rest, held)
	if cw.err == nil {
		n, err := apart.WriteTo(w)
		cw.n, cw.err = cw.n+n, err
	}
	cw.write(outer[at+2:])
	return cw.n, cw.err
}

// graphNodeField is GraphProto.node's field number.
const graphNodeField = 1

// nodeFieldSize is the encoded size of a node field whose message is size
// bytes.
func nodeFieldSize(size int) int {
	return protowire.SizeTag(graphNodeField) + protowire.SizeBytes(size)
}

// countWriter writes until the first error, counting what it wrote.
type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) write(parts ...[]byte) {
	for _, p := range parts {
		if c.err != nil {
			return
		}
		var n int
		n, c.err = c.w.Write(p)
		c.n += int64(n)
	}
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
