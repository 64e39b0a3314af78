package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
	"github.com/strata-llm/strata/sdk/dtype"
)

// gen builds one random case: source tensors and an expression over them.
type gen struct {
	rng     *rand.Rand
	entries []checkpoint.Entry
	data    [][]byte
}

// tensor adds a random source tensor and returns its leaf.
func (g *gen) tensor(dt string, shape ...int64) *transform.Expr {
	name := fmt.Sprintf("t%d", len(g.entries))
	g.entries = append(g.entries, checkpoint.Entry{Name: name, DType: dt, Shape: shape})
	g.data = append(g.data, g.bytes(dt, shape))
	return transform.Leaf(name)
}

// bytes draws values: for floats, normal values over several magnitudes
// (never NaN, so results compare exactly); for one-byte codes, any byte.
func (g *gen) bytes(dt string, shape []int64) []byte {
	info, _ := dtype.FromSafetensors(dt)
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	out := make([]byte, info.ByteSize(n))
	switch dt {
	case "F32", "F16", "BF16":
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(g.rng.NormFloat64() * math.Pow(2, float64(g.rng.IntN(16)-8)))
		}
		return encodeFloats(dt, v)
	default:
		for i := range out {
			out[i] = byte(g.rng.IntN(256))
		}
		if dt == "F8_E4M3" { // keep NaN codes out: NaN payloads need not agree
			for i, b := range out {
				if b&0x7f == 0x7f {
					out[i] = b &^ 1
				}
			}
		}
	}
	return out
}

func encodeFloats(dt string, v []float32) []byte {
	out := make([]byte, 0, 4*len(v))
	for _, x := range v {
		bits := math.Float32bits(x)
		switch dt {
		case "F32":
			out = binary.LittleEndian.AppendUint32(out, bits)
		case "BF16":
			out = binary.LittleEndian.AppendUint16(out, uint16(bits>>16))
		default: // F16: values chosen to be exact in half precision
			out = binary.LittleEndian.AppendUint16(out, half(x))
		}
	}
	return out
}

// half truncates a float32 to float16 bits (in range; tests only need
// some valid half values).
func half(x float32) uint16 {
	bits := math.Float32bits(x)
	sign := uint16(bits>>16) & 0x8000
	exp := int(bits>>23&0xff) - 127 + 15
	if exp <= 0 || exp >= 31 {
		return sign
	}
	return sign | uint16(exp)<<10 | uint16(bits>>13&0x3ff)
}

func (g *gen) dim() int64 { return int64(1 + g.rng.IntN(5)) }

func (g *gen) shape(rank int) []int64 {
	s := make([]int64, rank)
	for i := range s {
		s[i] = g.dim()
	}
	return s
}

var floatTypes = []string{"F32", "F16", "BF16"}

func (g *gen) pick(from []string) string { return from[g.rng.IntN(len(from))] }

// producer makes the expression's innermost part.
func (g *gen) producer() *transform.Expr {
	switch g.rng.IntN(9) {
	case 6:
		return g.packedInt()
	case 7:
		return g.nvfp4()
	case 8:
		return g.partialBlocks()
	case 0:
		return g.tensor(g.pick(append(floatTypes, "F8_E4M3", "U8")), g.shape(1+g.rng.IntN(3))...)
	case 1: // stack of per-expert tensors, maybe each dequantised first
		blocks, grid := g.shape(2), g.grid()
		n := 1 + g.rng.IntN(4)
		args := make([]*transform.Expr, n)
		fp8 := g.rng.IntN(2) == 0
		dt := g.pick(floatTypes)
		for i := range args {
			if fp8 {
				args[i] = g.fp8(blocks, grid)
			} else {
				args[i] = g.tensor(dt, blocks...)
			}
		}
		return &transform.Expr{Op: transform.OpStack, Args: args, Axis: int64(g.rng.IntN(3))}
	case 2:
		rank := 1 + g.rng.IntN(3)
		return g.concat(g.pick(floatTypes), rank, g.rng.IntN(rank))
	case 3:
		return g.mxfp4()
	default:
		return g.fp8(g.shape(2), g.grid())
	}
}

func (g *gen) grid() []int64 { return []int64{1 + int64(g.rng.IntN(3)), 1 + int64(g.rng.IntN(3))} }

func (g *gen) concat(dt string, rank, axis int) *transform.Expr {
	shape := g.shape(rank)
	var args []*transform.Expr
	for range 1 + g.rng.IntN(3) {
		s := append([]int64{}, shape...)
		s[axis] = g.dim()
		args = append(args, g.tensor(dt, s...))
	}
	return &transform.Expr{Op: transform.OpConcat, Args: args, Axis: int64(axis)}
}

func (g *gen) mxfp4() *transform.Expr {
	prefix := g.shape(1 + g.rng.IntN(2))
	groups := g.dim()
	blocks := g.tensor("U8", append(append([]int64{}, prefix...), groups, 16)...)
	scales := g.tensor(g.pick([]string{"U8", "F8_E8M0"}), append(append([]int64{}, prefix...), groups)...)
	return &transform.Expr{Op: transform.OpMXFP4, Args: []*transform.Expr{blocks, scales}}
}

// fp8 dequantises an E4M3 weight of grid × block elements with a
// per-tensor scale or one scale per block.
func (g *gen) fp8(block, grid []int64) *transform.Expr {
	w := g.tensor("F8_E4M3", block[0]*grid[0], block[1]*grid[1])
	var scale *transform.Expr
	switch g.rng.IntN(3) {
	case 0:
		scale = g.tensor(g.pick(floatTypes), 1)
	case 1:
		scale = g.tensor(g.pick([]string{"F32", "BF16"}), grid...)
	default:
		scale = g.tensor(g.pick([]string{"U8", "F8_E8M0"}), grid...)
	}
	return &transform.Expr{Op: transform.OpFP8, Args: []*transform.Expr{w, scale}}
}

// packedInt dequantises int codes packed into int32 words (compressed-tensors
// pack-quantized): per group or channel, with or without packed zero points.
func (g *gen) packedInt() *transform.Expr {
	bits := []int64{2, 4, 8}[g.rng.IntN(3)]
	per := 32 / bits
	rows, words := g.dim(), g.dim()
	cols := words*per - int64(g.rng.IntN(int(per))) // the last word may be part-filled
	group := 1 + int64(g.rng.IntN(int(cols)))
	groups := (cols + group - 1) / group
	packed := g.tensor("I32", rows, words)
	unpack := &transform.Expr{Op: transform.OpUnpackInt, Args: []*transform.Expr{packed}, Ints: []int64{bits, 1 << (bits - 1)}, Axis: 1, End: cols}
	args := []*transform.Expr{unpack, g.tensor(g.pick([]string{"F32", "BF16", "F16"}), rows, groups)}
	if g.rng.IntN(2) == 0 { // zero points packed along the rows
		zp := g.tensor("I32", (rows+per-1)/per, groups)
		args = append(args, &transform.Expr{Op: transform.OpUnpackInt, Args: []*transform.Expr{zp}, Ints: []int64{bits, 1 << (bits - 1)}, End: rows})
	}
	return &transform.Expr{Op: transform.OpDequant, Args: args, Ints: []int64{1, group}}
}

// nvfp4 dequantises E2M1 codes with E4M3 group scales times a float32
// second-level scale (ModelOpt NVFP4).
func (g *gen) nvfp4() *transform.Expr {
	rows, groups := g.dim(), g.dim()
	codes := &transform.Expr{Op: transform.OpUnpackFP4, Args: []*transform.Expr{g.tensor("U8", rows, groups*8)}}
	op := transform.OpMul
	if g.rng.IntN(2) == 0 {
		op = transform.OpDiv
	}
	scale := &transform.Expr{Op: op, Args: []*transform.Expr{g.tensor("F8_E4M3", rows, groups), g.tensor("F32", 1)}}
	return &transform.Expr{Op: transform.OpDequant, Args: []*transform.Expr{codes, scale}, Ints: []int64{1, 16}}
}

// partialBlocks dequantises an FP8 weight whose edge blocks are partial
// (a ceil-divided scale grid, as fine-grained FP8 stores it).
func (g *gen) partialBlocks() *transform.Expr {
	lead := g.shape(g.rng.IntN(2))
	block := []int64{1 + int64(g.rng.IntN(4)), 1 + int64(g.rng.IntN(4))}
	rows, cols := g.dim()*2, g.dim()*2
	w := g.tensor("F8_E4M3", append(slices.Clone(lead), rows, cols)...)
	grid := append(slices.Clone(lead), (rows+block[0]-1)/block[0], (cols+block[1]-1)/block[1])
	return &transform.Expr{Op: transform.OpDequant, Args: []*transform.Expr{w, g.tensor(g.pick([]string{"F32", "BF16"}), grid...)}, Ints: block}
}

// unary wraps e in a random shape or type change.
func (g *gen) unary(e *transform.Expr) *transform.Expr {
	rank := len(e.Type.Shape)
	switch g.rng.IntN(4) {
	case 0:
		return &transform.Expr{Op: transform.OpTranspose, Args: []*transform.Expr{e}, Ints: g.perm(rank)}
	case 1:
		return &transform.Expr{Op: transform.OpReshape, Args: []*transform.Expr{e}, Ints: []int64{e.Type.Elements()}}
	case 2:
		axis := g.rng.IntN(rank)
		dim := e.Type.Shape[axis]
		start := int64(g.rng.IntN(int(dim)))
		return &transform.Expr{Op: transform.OpSlice, Args: []*transform.Expr{e}, Axis: int64(axis), Start: start,
			End: start + 1 + int64(g.rng.IntN(int(dim-start))), Step: 1 + int64(g.rng.IntN(2))}
	default:
		if !isFloat(e.Type.DType) { // FP8 is only ever dequantised with its scale
			return e
		}
		return transform.Cast(e, g.pick([]string{"float32", "float16", "bfloat16"}))
	}
}

func isFloat(t dtype.DType) bool {
	n := dtype.Name(t)
	return n == "float32" || n == "float16" || n == "bfloat16"
}

func (g *gen) perm(rank int) []int64 {
	p := make([]int64, rank)
	for i, v := range g.rng.Perm(rank) {
		p[i] = int64(v)
	}
	return p
}

func writeRandomCases(dir string, count int, rng *rand.Rand) error {
	var cases []caseInfo
	for i := range count {
		g := &gen{rng: rng}
		e := g.producer()
		src := filepath.Join(dir, fmt.Sprintf("case%04d.safetensors", i))
		if err := g.write(src); err != nil {
			return err
		}
		// Apply unary steps one at a time: each needs its argument's type.
		for range g.rng.IntN(4) {
			if err := inferFrom(src, e); err != nil {
				return fmt.Errorf("case %d: %s: %w", i, e, err)
			}
			e = g.unary(e)
		}
		info, err := writeCase(dir, fmt.Sprintf("case%04d", i), src, e, nil)
		if err != nil {
			return fmt.Errorf("case %d: %s: %w", i, e, err)
		}
		os.Remove(src)
		cases = append(cases, info)
	}
	return writeIndex(dir, cases)
}

func (g *gen) write(path string) error {
	w, err := checkpoint.CreateSafetensors(path, g.entries)
	if err != nil {
		return err
	}
	for _, d := range g.data {
		if err := w.Write(d); err != nil {
			w.Abort()
			return err
		}
	}
	return w.Close()
}

func inferFrom(src string, e *transform.Expr) error {
	ckpt, err := checkpoint.OpenFile(src)
	if err != nil {
		return err
	}
	return e.Infer(func(key string) (transform.Type, error) {
		t, _ := ckpt.Tensor(key)
		info, _ := dtype.FromSafetensors(t.DType)
		return transform.Type{DType: info.ONNX, Shape: t.Shape}, nil
	})
}
