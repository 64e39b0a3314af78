package transform

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// The dequantising transforms of quantised checkpoints (host/quant builds
// them; plugins never write them):
//
//	dequant(q, scale[, zero_point])  (q - zero_point) × scale in float32, the
//	    scale one value or one per block of q's last two axes. Ints is the
//	    block [rows, cols]; the scale grid is then ceil(R/rows) × ceil(C/cols)
//	    (partial blocks at the edges, as FineGrainedFP8 and compressed-tensors
//	    store them). Without Ints each weight dimension is a multiple of the
//	    scale's. q is FP8 (decoded), an integer type, or float32.
//	unpack_int(packed)  Ints [bits, offset]: the bits-wide codes packed into
//	    each int32 along Axis, lowest bits first, each minus offset; End is the
//	    unpacked length along Axis (0: all).
//	unpack_fp4(codes)  U8 [..., N] to float32 [..., 2N]: two E2M1 codes a byte,
//	    the low nibble first.
//	mul(a, b), div(a, b)  a × b or a / b in float32; b one value or a's shape.
//
// Every step computes what torch computes in float32, so the in-graph
// lowering, Eval and the quantisation libraries agree bit for bit.

// blockGrid is how a dequant's scale maps onto its weight: scalar, or the
// block (bm, bn) of the last two axes each scale covers.
type blockGrid struct {
	scalar                       bool
	rows, cols, srows, scols, bm int64
	bn, lead                     int64
}

// exact reports whether the blocks tile the weight with no partial block.
func (g blockGrid) exact() bool { return g.bm*g.srows == g.rows && g.bn*g.scols == g.cols }

func (e *Expr) grid() blockGrid {
	w, s := e.Args[0].Type, e.Args[1].Type
	if s.Elements() == 1 && (len(e.Ints) == 0 || len(s.Shape) < 2) {
		return blockGrid{scalar: true}
	}
	r := len(w.Shape)
	g := blockGrid{rows: w.Shape[r-2], cols: w.Shape[r-1], srows: s.Shape[r-2], scols: s.Shape[r-1], lead: prod(w.Shape[:r-2])}
	if len(e.Ints) == 2 {
		// A block larger than the weight (a 128 block of a 64-wide tensor)
		// is the whole dimension: clamped, the grid stays exact and the
		// in-graph form never expands a scale past the weight.
		g.bm, g.bn = min(e.Ints[0], g.rows), min(e.Ints[1], g.cols)
	} else {
		g.bm, g.bn = g.rows/g.srows, g.cols/g.scols
	}
	return g
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func isInt(t dtype.DType) bool {
	return t == onnxpb.TensorProto_INT8 || t == onnxpb.TensorProto_UINT8 || t == onnxpb.TensorProto_INT32
}

func inferDequant(e *Expr) (Type, error) {
	w, s := e.Args[0].Type, e.Args[1].Type
	if e.Op == OpFP8 && (!isFP8(w.DType) || w.DType == onnxpb.TensorProto_FLOAT8E8M0) {
		return Type{}, fmt.Errorf("needs an F8_E4M3 or F8_E5M2 weight, got %s", w)
	}
	if !isFP8(w.DType) && !isInt(w.DType) && w.DType != onnxpb.TensorProto_FLOAT || w.DType == onnxpb.TensorProto_FLOAT8E8M0 {
		return Type{}, fmt.Errorf("dequantises FP8, integer or float32 values, got %s", w)
	}
	if !isFloat(s.DType) && !isExponent(s.DType) && !isFP8(s.DType) {
		return Type{}, fmt.Errorf("needs a float, FP8 or exponent (U8, F8_E8M0) scale, got %s", s)
	}
	if len(e.Args) == 3 {
		z := e.Args[2].Type
		if !isInt(z.DType) && !isFloat(z.DType) {
			return Type{}, fmt.Errorf("needs an integer or float zero point, got %s", z)
		}
		if !slices.Equal(z.Shape, s.Shape) && z.Elements() != 1 || z.Elements() == 1 && s.Elements() != 1 {
			return Type{}, fmt.Errorf("zero point %v must have the scale's shape %v", z.Shape, s.Shape)
		}
	}
	out := Type{onnxpb.TensorProto_FLOAT, w.Shape}
	if len(e.Ints) != 0 && len(e.Ints) != 2 {
		return Type{}, fmt.Errorf("block %v: give rows and columns", e.Ints)
	}
	if len(e.Ints) == 2 && (e.Ints[0] <= 0 || e.Ints[1] <= 0) {
		return Type{}, fmt.Errorf("block %v: both sizes must be positive", e.Ints)
	}
	if s.Elements() == 1 && (len(e.Ints) == 0 || len(s.Shape) < 2) {
		return out, nil
	}
	r := len(w.Shape)
	if r < 2 || len(s.Shape) != r || !slices.Equal(s.Shape[:r-2], w.Shape[:r-2]) || s.Shape[r-2] == 0 || s.Shape[r-1] == 0 {
		return Type{}, fmt.Errorf("scale %v is not a block grid of weight %v", s.Shape, w.Shape)
	}
	if len(e.Ints) == 2 {
		want := []int64{ceilDiv(w.Shape[r-2], e.Ints[0]), ceilDiv(w.Shape[r-1], e.Ints[1])}
		if !slices.Equal(s.Shape[r-2:], want) {
			return Type{}, fmt.Errorf("scale %v is not the grid of %v blocks of weight %v (want %v)", s.Shape, e.Ints, w.Shape, want)
		}
		return out, nil
	}
	if w.Shape[r-2]%s.Shape[r-2] != 0 || w.Shape[r-1]%s.Shape[r-1] != 0 {
		return Type{}, fmt.Errorf("scale %v is not a block grid of weight %v (each weight dimension a multiple of the scale's)", s.Shape, w.Shape)
	}
	return out, nil
}

func inferUnpackInt(e *Expr) (Type, error) {
	src := e.Args[0].Type
	if src.DType != onnxpb.TensorProto_INT32 {
		return Type{}, fmt.Errorf("unpacks int32 words, got %s", src)
	}
	if len(e.Ints) != 2 || e.Ints[0] != 2 && e.Ints[0] != 4 && e.Ints[0] != 8 || e.Ints[1] < 0 || e.Ints[1] >= 1<<e.Ints[0] {
		return Type{}, fmt.Errorf("parameters %v: give [bits, offset] with bits 2, 4 or 8 and 0 ≤ offset < 2^bits", e.Ints)
	}
	axis, err := normAxis(e.Axis, len(src.Shape))
	if err != nil {
		return Type{}, err
	}
	e.Axis = axis
	per := 32 / e.Ints[0]
	full := src.Shape[axis] * per
	if e.End == 0 {
		e.End = full
	}
	if e.End > full || e.End <= full-per {
		return Type{}, fmt.Errorf("%d values do not pack into %d words of %d", e.End, src.Shape[axis], per)
	}
	shape := slices.Clone(src.Shape)
	shape[axis] = e.End
	return Type{onnxpb.TensorProto_INT32, shape}, nil
}

func inferUnpackFP4(e *Expr) (Type, error) {
	src := e.Args[0].Type
	if src.DType != onnxpb.TensorProto_UINT8 || len(src.Shape) == 0 {
		return Type{}, fmt.Errorf("unpacks U8 bytes of two E2M1 codes, got %s", src)
	}
	shape := slices.Clone(src.Shape)
	shape[len(shape)-1] *= 2
	return Type{onnxpb.TensorProto_FLOAT, shape}, nil
}

func inferScalarArith(e *Expr) (Type, error) {
	a, b := e.Args[0].Type, e.Args[1].Type
	for _, t := range []Type{a, b} {
		if !isFloat(t.DType) && !isFP8(t.DType) {
			return Type{}, fmt.Errorf("needs float or FP8 operands, got %s", t)
		}
	}
	if b.Elements() != 1 && !slices.Equal(a.Shape, b.Shape) {
		return Type{}, fmt.Errorf("operand %v is neither one value nor of shape %v", b.Shape, a.Shape)
	}
	return Type{onnxpb.TensorProto_FLOAT, a.Shape}, nil
}

// values decodes a dequant operand to float32: FP8 and exponents by their
// code tables, integers by value, floats as they are.
func values(t dtype.DType, data []byte) []float32 {
	switch t {
	case onnxpb.TensorProto_INT8:
		out := make([]float32, len(data))
		for i, b := range data {
			out[i] = float32(int8(b))
		}
		return out
	case onnxpb.TensorProto_INT32:
		out := make([]float32, len(data)/4)
		for i := range out {
			out[i] = float32(int32(binary.LittleEndian.Uint32(data[4*i:])))
		}
		return out
	}
	return toFloat32(t, data)
}

// intValues is values, except that a U8 operand is an integer, not an
// exponent code (a dequant's weight and zero point).
func intValues(t dtype.DType, data []byte) []float32 {
	if t == onnxpb.TensorProto_UINT8 {
		out := make([]float32, len(data))
		for i, b := range data {
			out[i] = float32(b)
		}
		return out
	}
	return values(t, data)
}

func evalDequant(e *Expr, a []Data) []byte {
	vals := intValues(a[0].Type.DType, a[0].Bytes)
	scale := values(a[1].Type.DType, a[1].Bytes)
	var zero []float32
	if len(a) == 3 {
		zero = intValues(a[2].Type.DType, a[2].Bytes)
	}
	g := e.grid()
	for i := range vals {
		var j int64
		if !g.scalar {
			p, rc := int64(i)/(g.rows*g.cols), int64(i)%(g.rows*g.cols)
			j = p*g.srows*g.scols + (rc/g.cols/g.bm)*g.scols + (rc%g.cols)/g.bn
		}
		if zero != nil {
			vals[i] -= zero[j]
		}
		vals[i] *= scale[j]
	}
	return fromFloat32(onnxpb.TensorProto_FLOAT, vals)
}

func evalUnpackInt(e *Expr, a []Data) []byte {
	src := a[0]
	bits, offset := e.Ints[0], int32(e.Ints[1])
	per, mask := 32/bits, uint32(1)<<bits-1
	outer, words := prod(src.Type.Shape[:e.Axis]), src.Type.Shape[e.Axis]
	inner := prod(src.Type.Shape[e.Axis+1:])
	out := make([]byte, 4*outer*e.End*inner)
	for o := range outer {
		for w := range words {
			for in := range inner {
				word := binary.LittleEndian.Uint32(src.Bytes[4*((o*words+w)*inner+in):])
				for k := range per {
					pos := w*per + k
					if pos >= e.End {
						break
					}
					v := int32(word>>(bits*k)&mask) - offset
					binary.LittleEndian.PutUint32(out[4*((o*e.End+pos)*inner+in):], uint32(v))
				}
			}
		}
	}
	return out
}

func evalUnpackFP4(_ *Expr, a []Data) []byte {
	out := make([]byte, 8*len(a[0].Bytes))
	for i, code := range a[0].Bytes {
		binary.LittleEndian.PutUint32(out[8*i:], math.Float32bits(fp4Values[code&0x0f]))
		binary.LittleEndian.PutUint32(out[8*i+4:], math.Float32bits(fp4Values[code>>4]))
	}
	return out
}

func evalScalarArith(e *Expr, a []Data) []byte {
	x, y := values(a[0].Type.DType, a[0].Bytes), values(a[1].Type.DType, a[1].Bytes)
	for i := range x {
		b := y[0]
		if len(y) > 1 {
			b = y[i]
		}
		if e.Op == OpMul {
			x[i] *= b
		} else {
			x[i] /= b
		}
	}
	return fromFloat32(onnxpb.TensorProto_FLOAT, x)
}

// storedBytes is x's bytes as UINT8 (the last axis 4× longer) when x is a
// stored int32 tensor or a stack of them before its last axis (a MoE
// layer's experts, hoisted).
func (l lowering) storedBytes(x *Expr) (string, bool, error) {
	byteShape := func(s []int64) []int64 {
		b := slices.Clone(s)
		b[len(b)-1] *= 4
		return b
	}
	switch {
	case x.IsLeaf():
		v, err := l.g.Bytes(x.Key, byteShape(x.Type.Shape))
		return v, true, err
	case x.Op == OpStack && x.Axis < int64(len(x.Args[0].Type.Shape)) && !slices.ContainsFunc(x.Args, func(a *Expr) bool { return !a.IsLeaf() }):
		parts := make([]string, len(x.Args))
		for i, a := range x.Args {
			var err error
			if parts[i], err = l.g.Bytes(a.Key, byteShape(a.Type.Shape)); err != nil {
				return "", true, err
			}
		}
		return l.reshape(l.g.Node("Concat", parts, intAttr("axis", x.Axis)), byteShape(x.Type.Shape)), true, nil
	}
	return "", false, nil
}

func (l lowering) uint8Scalar(v int64) string {
	return l.const_(&onnxpb.TensorProto{DataType: int32(onnxpb.TensorProto_UINT8), RawData: []byte{byte(v)}})
}

// operand brings a dequant operand to float32 in the graph (U8 as an
// integer when integer is set, else as an exponent code).
func (l lowering) operand(x string, t dtype.DType, integer bool) string {
	if isInt(t) && (integer || t != onnxpb.TensorProto_UINT8) {
		return l.g.Node("Cast", []string{x}, intAttr("to", int64(onnxpb.TensorProto_FLOAT)))
	}
	return l.toFloat32(x, t)
}

// dequant computes (q - zero) × scale in float32: scalar, over exact blocks
// by reshaping the stored values into them before decoding (narrower
// intermediates), or with the scale grid expanded to the weight and cut at
// its edges when blocks are partial.
func (l lowering) dequant(e *Expr) (string, error) {
	wt := e.Args[0].Type
	g := e.grid()
	blocks := []int64{g.lead, g.srows, g.bm, g.scols, g.bn}
	q, err := l.values(e.Args[0], func(x string) string {
		if !g.scalar && g.exact() {
			return l.reshape(x, blocks)
		}
		return x
	})
	if err != nil {
		return "", err
	}
	scale, err := l.lowered(e.Args[1], false)
	if err != nil {
		return "", err
	}
	zero := ""
	if len(e.Args) == 3 {
		if zero, err = l.lowered(e.Args[2], true); err != nil {
			return "", err
		}
	}
	apply := func(q, zero, scale string) string {
		if zero != "" {
			q = l.g.Node("Sub", []string{q, zero})
		}
		return l.g.Node("Mul", []string{q, scale})
	}
	switch {
	case g.scalar:
		if zero != "" {
			zero = l.reshape(zero, []int64{1})
		}
		return apply(q, zero, l.reshape(scale, []int64{1})), nil
	case g.exact():
		cell := []int64{g.lead, g.srows, 1, g.scols, 1}
		if zero != "" {
			zero = l.reshape(zero, cell)
		}
		return l.reshape(apply(q, zero, l.reshape(scale, cell)), wt.Shape), nil
	default:
		if zero != "" {
			zero = l.expandGrid(zero, g, wt.Shape)
		}
		return apply(q, zero, l.expandGrid(scale, g, wt.Shape)), nil
	}
}

// lowered lowers a dequant operand and brings it to float32 (U8 as an
// integer when integer is set, else as an exponent code).
func (l lowering) lowered(e *Expr, integer bool) (string, error) {
	x, err := e.Lower(l.g)
	if err != nil {
		return "", err
	}
	return l.operand(x, e.Type.DType, integer), nil
}

// values lowers a dequant's values to float32, shaped by shape (a reshape
// or the identity) while still in their stored width: packed int codes
// straight from their bytes to float, FP8 bytes before their decode.
func (l lowering) values(e *Expr, shape func(string) string) (string, error) {
	if codes, ok, err := l.storedCodes(e); ok || err != nil {
		f := l.g.Node("Cast", []string{shape(codes)}, intAttr("to", int64(onnxpb.TensorProto_FLOAT)))
		return l.g.Node("Sub", []string{f, l.table([]float32{float32(e.Ints[1])})}), err
	}
	x, err := e.Lower(l.g)
	if err != nil {
		return "", err
	}
	return l.operand(shape(x), e.Type.DType, true), nil
}

// expandGrid repeats each grid value over its block and cuts the partial
// blocks at the weight's edges: [lead, SR, SC] to the weight's shape.
func (l lowering) expandGrid(x string, g blockGrid, shape []int64) string {
	cells := l.reshape(x, []int64{g.lead, g.srows, 1, g.scols, 1})
	full := l.g.Node("Expand", []string{cells, l.int64s(g.lead, g.srows, g.bm, g.scols, g.bn)})
	tiled := l.reshape(full, []int64{g.lead, g.srows * g.bm, g.scols * g.bn})
	cut := l.g.Node("Slice", []string{tiled, l.int64s(0, 0), l.int64s(g.rows, g.cols), l.int64s(1, 2)})
	return l.reshape(cut, shape)
}

// unpackInt splits each int32 word into its codes: from the stored bytes
// when it can (storedCodes), else with int64 arithmetic (exact, and no
// bitwise operators on signed types): the word made unsigned, divided by
// each code's place value, modulo 2^bits.
func (l lowering) unpackInt(e *Expr) (string, error) {
	if codes, ok, err := l.storedCodes(e); ok || err != nil {
		wide := l.g.Node("Cast", []string{codes}, intAttr("to", int64(onnxpb.TensorProto_INT32)))
		return l.g.Node("Sub", []string{wide, l.int32Scalar(int32(e.Ints[1]))}), err
	}
	x, err := e.Args[0].Lower(l.g)
	if err != nil {
		return "", err
	}
	src := e.Args[0].Type
	bits := e.Ints[0]
	per := 32 / bits
	words := l.g.Node("Cast", []string{x}, intAttr("to", int64(onnxpb.TensorProto_INT64)))
	unsigned := l.g.Node("Mod", []string{words, l.int64s(1 << 32)})
	inner := len(src.Shape) - int(e.Axis) - 1
	places := make([]int64, per)
	for k := range places {
		places[k] = 1 << (bits * int64(k))
	}
	placeShape := append([]int64{per}, make([]int64, inner)...)
	for i := 1; i < len(placeShape); i++ {
		placeShape[i] = 1
	}
	spread := l.g.Node("Unsqueeze", []string{unsigned, l.int64s(e.Axis + 1)})
	shifted := l.g.Node("Div", []string{spread, l.reshape(l.int64s(places...), placeShape)})
	codes := l.g.Node("Sub", []string{l.g.Node("Mod", []string{shifted, l.int64s(1 << bits)}), l.int64s(e.Ints[1])})
	merged := slices.Clone(src.Shape)
	merged[e.Axis] *= per
	flat := l.reshape(codes, merged)
	if e.End != merged[e.Axis] {
		flat = l.g.Node("Slice", []string{flat, l.int64s(0), l.int64s(e.End), l.int64s(e.Axis)})
	}
	return l.g.Node("Cast", []string{flat}, intAttr("to", int64(onnxpb.TensorProto_INT32))), nil
}

// storedCodes is, for unpack_int of a stored tensor along its last axis,
// its codes (each plus the offset, as stored) as UINT8 [..., End]: the
// int32 words read as the little-endian bytes they are, each byte split
// into its codes with uint8 Mod/Div — code k of a word lies in byte
// k·bits/8, lowest bits first. Intermediates stay a byte wide: the int64
// form made ONNX Runtime fold four 8-byte copies of every weight
// (Llama-8B layer: 37 s and 11.6 GB to open, this form 9 s, 4.4 GB).
func (l lowering) storedCodes(e *Expr) (string, bool, error) {
	if e.Op != OpUnpackInt || e.Axis != int64(len(e.Args[0].Type.Shape)-1) {
		return "", false, nil
	}
	raw, ok, err := l.storedBytes(e.Args[0])
	if !ok || err != nil {
		return "", ok, err
	}
	src := e.Args[0].Type
	bits, rank := e.Ints[0], len(src.Shape)
	byteShape := slices.Clone(src.Shape)
	byteShape[rank-1] *= 4
	codes := raw
	if bits < 8 {
		perByte := 8 / bits
		parts := make([]string, perByte)
		last := l.int64s(-1)
		for k := range parts {
			c := raw
			if k > 0 {
				c = l.g.Node("Div", []string{c, l.uint8Scalar(1 << (bits * int64(k)))})
			}
			if k < int(perByte)-1 {
				c = l.g.Node("Mod", []string{c, l.uint8Scalar(1 << bits)})
			}
			parts[k] = l.g.Node("Unsqueeze", []string{c, last})
		}
		shape := slices.Clone(byteShape)
		shape[rank-1] *= perByte
		codes = l.reshape(l.g.Node("Concat", parts, intAttr("axis", -1)), shape)
	}
	if full := src.Shape[rank-1] * (32 / bits); e.End != full {
		codes = l.g.Node("Slice", []string{codes, l.int64s(0), l.int64s(e.End), l.int64s(int64(rank - 1))})
	}
	return codes, true, nil
}

// unpackFP4 decodes both nibbles of each byte, the low one first.
func (l lowering) unpackFP4(e *Expr, x string) string { return l.fp4Pairs(x, e.Type.Shape) }

func (l lowering) scalarArith(e *Expr, args []string) string {
	a := l.toFloat32(args[0], e.Args[0].Type.DType)
	b := l.toFloat32(args[1], e.Args[1].Type.DType)
	if e.Args[1].Type.Elements() == 1 {
		b = l.reshape(b, []int64{1})
	}
	op := "Mul"
	if e.Op == OpDiv {
		op = "Div"
	}
	return l.g.Node(op, []string{a, b})
}
