package check

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/checkpoint"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// model is what check reads of a model file, streaming it: a 3 GB model
// (most of it inline data, or a sparse file) is read once, never held.
type model struct {
	nodes        int
	inputs       []string
	outputs      []string
	graphs       int // graph fields seen
	initializers []*onnxpb.TensorProto
	metadata     map[string]string
}

// Field numbers of the ONNX protobuf messages check reads.
const (
	modelGraph    = 7
	modelMetadata = 14
	graphNode     = 1
	graphInit     = 5
	graphInput    = 11
	graphOutput   = 12
	entryKey      = 1
	entryValue    = 2
	valueInfoName = 1
)

// Bounds of what is held of one field.
const (
	maxName     = 64 << 10  // a tensor, input or output name; a metadata key
	maxExternal = 1 << 20   // a tensor's external_data entries, each
	maxMetadata = 256 << 20 // a metadata value (a window's whole weight spec)
)

// tensorFields are the TensorProto fields of an external reference, and
// how large each may be: raw_data and the typed data lists are skipped.
var tensorFields = map[protowire.Number]int64{
	1:  maxExternal, // dims (packed)
	2:  0,           // data_type
	8:  maxName,     // name
	13: maxExternal, // external_data
	14: 0,           // data_location
}

// readModel streams the model file at path.
func readModel(path string) (*model, error) {
	f, info, err := checkpoint.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := &scanner{r: bufio.NewReaderSize(f, 1<<20), f: f}
	m := &model{metadata: map[string]string{}}
	err = s.each(info.Size(), func(num protowire.Number, size int64) error {
		switch num {
		case modelGraph:
			m.graphs++
			return s.each(size, m.graphField(s))
		case modelMetadata:
			data, err := s.collect(size, map[protowire.Number]int64{entryKey: maxName, entryValue: maxMetadata})
			if err != nil {
				return err
			}
			var e onnxpb.StringStringEntryProto
			if err := proto.Unmarshal(data, &e); err != nil {
				return err
			}
			m.metadata[e.GetKey()] = e.GetValue()
			return nil
		}
		return s.skip(size)
	})
	if err != nil {
		return nil, fmt.Errorf("%s: not an ONNX model: %w", path, err)
	}
	return m, nil
}

// graphField reads one field of a GraphProto.
func (m *model) graphField(s *scanner) func(protowire.Number, int64) error {
	return func(num protowire.Number, size int64) error {
		switch num {
		case graphNode:
			m.nodes++
		case graphInit:
			data, err := s.collect(size, tensorFields)
			if err != nil {
				return err
			}
			var t onnxpb.TensorProto
			if err := proto.Unmarshal(data, &t); err != nil {
				return err
			}
			m.initializers = append(m.initializers, &t)
			return nil
		case graphInput, graphOutput:
			data, err := s.collect(size, map[protowire.Number]int64{valueInfoName: maxName})
			if err != nil {
				return err
			}
			var v onnxpb.ValueInfoProto
			if err := proto.Unmarshal(data, &v); err != nil {
				return err
			}
			if num == graphInput {
				m.inputs = append(m.inputs, v.GetName())
			} else {
				m.outputs = append(m.outputs, v.GetName())
			}
			return nil
		}
		return s.skip(size)
	}
}

// scanner reads protobuf fields from a stream, holding none it is not
// asked to.
type scanner struct {
	r   *bufio.Reader
	f   io.ReadSeeker // under r: a long skip seeks
	off int64
}

var errTruncated = errors.New("a field runs past the end of its message")

func (s *scanner) varint() (uint64, []byte, error) {
	var raw []byte
	for len(raw) < 10 {
		b, err := s.r.ReadByte()
		if err != nil {
			return 0, nil, errTruncated
		}
		s.off++
		raw = append(raw, b)
		if b < 0x80 {
			v, n := protowire.ConsumeVarint(raw)
			if n < 0 {
				return 0, nil, protowire.ParseError(n)
			}
			return v, raw, nil
		}
	}
	return 0, nil, errors.New("a varint longer than 10 bytes")
}

// field reads the next field's tag and, for a length-delimited field, its
// length; other fields' values come back raw.
func (s *scanner) field(end int64) (protowire.Number, protowire.Type, []byte, int64, error) {
	tag, _, err := s.varint()
	if err != nil {
		return 0, 0, nil, 0, err
	}
	num, typ := protowire.DecodeTag(tag)
	if num < protowire.MinValidNumber || num > protowire.MaxValidNumber {
		return 0, 0, nil, 0, fmt.Errorf("invalid field number %d at byte %d", num, s.off)
	}
	switch typ {
	case protowire.VarintType:
		_, raw, err := s.varint()
		return num, typ, raw, 0, err
	case protowire.Fixed32Type, protowire.Fixed64Type:
		n := 4
		if typ == protowire.Fixed64Type {
			n = 8
		}
		raw := make([]byte, n)
		if _, err := io.ReadFull(s.r, raw); err != nil {
			return 0, 0, nil, 0, errTruncated
		}
		s.off += int64(n)
		return num, typ, raw, 0, nil
	case protowire.BytesType:
		size, _, err := s.varint()
		if err != nil {
			return 0, 0, nil, 0, err
		}
		if size > uint64(end-s.off) {
			return 0, 0, nil, 0, errTruncated
		}
		return num, typ, nil, int64(size), nil
	}
	return 0, 0, nil, 0, fmt.Errorf("unsupported wire type %d at byte %d", typ, s.off)
}

// each calls fn for every length-delimited field of the message in the
// next n bytes; fn consumes exactly size bytes. Other fields are passed
// over.
func (s *scanner) each(n int64, fn func(num protowire.Number, size int64) error) error {
	end := s.off + n
	for s.off < end {
		num, typ, _, size, err := s.field(end)
		if err != nil {
			return err
		}
		if typ != protowire.BytesType {
			continue
		}
		if err := fn(num, size); err != nil {
			return err
		}
	}
	if s.off != end {
		return errTruncated
	}
	return nil
}

// collect re-encodes, of the message in the next n bytes, the fields keep
// names (length-delimited ones no longer than keep says), for
// proto.Unmarshal; the others are skipped.
func (s *scanner) collect(n int64, keep map[protowire.Number]int64) ([]byte, error) {
	var out []byte
	end := s.off + n
	for s.off < end {
		num, typ, raw, size, err := s.field(end)
		if err != nil {
			return nil, err
		}
		limit, ok := keep[num]
		switch {
		case typ != protowire.BytesType:
			if ok {
				out = append(protowire.AppendTag(out, num, typ), raw...)
			}
		case ok && size <= limit:
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendVarint(out, uint64(size))
			buf := make([]byte, size)
			if _, err := io.ReadFull(s.r, buf); err != nil {
				return nil, errTruncated
			}
			s.off += size
			out = append(out, buf...)
		default:
			if err := s.skip(size); err != nil {
				return nil, err
			}
		}
	}
	if s.off != end {
		return nil, errTruncated
	}
	return out, nil
}

// skip passes over n bytes: a long run (a node's or raw data's) by a seek
// (a 3 GB field is not read), a short one from the buffer.
func (s *scanner) skip(n int64) error {
	if b := int64(s.r.Buffered()); n > b && s.f != nil {
		if _, err := s.f.Seek(n-b, io.SeekCurrent); err != nil {
			return err
		}
		s.r.Reset(s.f)
		s.off += n
		return nil
	}
	for n > 0 {
		k, err := s.r.Discard(int(min(n, 1<<30)))
		s.off += int64(k)
		n -= int64(k)
		if err != nil {
			return errTruncated
		}
	}
	return nil
}
