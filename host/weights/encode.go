package weights

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/strata-llm/strata/host/weights/transform"
)

// appendWeight appends w as json.Marshal writes it
// (TestWeightEncodingIsJSONMarshal). By hand: encoding/json's reflection
// over GLM-4.6's 44,689 sources and their expressions was 0.15 s of an
// export, once for the windows' metadata and once for weight_spec.json.
func appendWeight(b []byte, w *Weight) []byte {
	b = append(b, `{"name":`...)
	b = appendString(b, w.Name)
	b = append(b, `,"dtype":`...)
	b = appendString(b, w.DType)
	b = append(b, `,"shape":`...)
	b = appendInts(b, w.Shape, true)
	b = append(b, `,"sources":`...)
	if w.Sources == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range w.Sources {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendSource(b, &w.Sources[i])
		}
		b = append(b, ']')
	}
	if w.Transform != nil {
		b = append(b, `,"transform":`...)
		b = appendExpr(b, w.Transform)
	} else if w.packed != nil {
		b = append(b, `,"transform":`...)
		b, _ = appendPacked(b, w.packed, 0)
	}
	if d := w.Data; d != nil {
		b = append(b, `,"data":{"file":`...)
		b = strconv.AppendInt(b, int64(d.File), 10)
		b = append(b, `,"offset":`...)
		b = strconv.AppendInt(b, d.Offset, 10)
		b = append(b, `,"length":`...)
		b = strconv.AppendInt(b, d.Length, 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendSource(b []byte, s *Source) []byte {
	b = append(b, `{"key":`...)
	b = appendString(b, s.Key)
	b = append(b, `,"file":`...)
	b = strconv.AppendInt(b, int64(s.File), 10)
	b = append(b, `,"offset":`...)
	b = strconv.AppendInt(b, s.Offset, 10)
	b = append(b, `,"length":`...)
	b = strconv.AppendInt(b, s.Length, 10)
	b = append(b, `,"dtype":`...)
	b = appendString(b, s.DType)
	b = append(b, `,"shape":`...)
	b = appendInts(b, s.Shape, true)
	return append(b, '}')
}

// appendExpr writes the fields transform.Expr's tags name, empty ones
// omitted.
func appendExpr(b []byte, e *transform.Expr) []byte {
	return appendExprNode(b, e, len(e.Args), func(b []byte, i int) []byte {
		if e.Args[i] == nil {
			return append(b, "null"...)
		}
		return appendExpr(b, e.Args[i])
	})
}

// appendPacked writes p's node i as appendExpr writes the expression it
// packs, and returns the index after its subtree.
func appendPacked(b []byte, p transform.Packed, i int) ([]byte, int) {
	key, op, args := p.Node(i)
	if op == nil { // a leaf, as appendExpr writes one
		if key == "" {
			return append(b, "{}"...), i + 1
		}
		b = append(b, `{"key":`...)
		return append(appendString(b, key), '}'), i + 1
	}
	next := i + 1
	b = appendExprNode(b, op, args, func(b []byte, _ int) []byte {
		b, next = appendPacked(b, p, next)
		return b
	})
	return b, next
}

// appendExprNode writes e's fields, its args (n of them) by appendArg.
func appendExprNode(b []byte, e *transform.Expr, n int, appendArg func([]byte, int) []byte) []byte {
	b = append(b, '{')
	comma := false
	field := func(name string) {
		if comma {
			b = append(b, ',')
		}
		comma = true
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":`...)
	}
	if e.Key != "" {
		field("key")
		b = appendString(b, e.Key)
	}
	if e.Op != "" {
		field("op")
		b = appendString(b, e.Op)
	}
	if n > 0 {
		field("args")
		b = append(b, '[')
		for i := range n {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendArg(b, i)
		}
		b = append(b, ']')
	}
	if len(e.Ints) > 0 {
		field("ints")
		b = appendInts(b, e.Ints, false)
	}
	for _, p := range [...]struct {
		name string
		v    int64
	}{{"axis", e.Axis}, {"start", e.Start}, {"end", e.End}, {"step", e.Step}} {
		if p.v != 0 {
			field(p.name)
			b = strconv.AppendInt(b, p.v, 10)
		}
	}
	if e.To != "" {
		field("to")
		b = appendString(b, e.To)
	}
	return append(b, '}')
}

// appendInts writes a list of numbers; nil is null when nullable.
func appendInts(b []byte, v []int64, nullable bool) []byte {
	if v == nil && nullable {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, x, 10)
	}
	return append(b, ']')
}

// appendString quotes s as encoding/json does: plain printable ASCII as it
// is, anything else through json.Marshal (its escapes, HTML's included).
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			quoted, _ := json.Marshal(s)
			return append(b, quoted...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
