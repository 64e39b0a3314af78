package convert

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/outdir"
)

// chunkBytes bounds what one step reads from a source tensor: memory is
// a few chunks per job, whatever the layer's size, and Ctrl-C is noticed
// between chunks.
const chunkBytes = 16 << 20

// shardResult describes a written shard.
type shardResult struct {
	File       string `json:"file"`
	Size       int64  `json:"size"`
	HeaderHash string `json:"header_sha256"` // of the safetensors header: the tensors, their types and offsets
	Bytes      int64  `json:"tensor_bytes"`
}

// writeShard writes the groups' outputs as one safetensors file rel in d,
// through a temporary file renamed into place when complete.
func writeShard(ctx context.Context, d *outdir.Dir, rel string, groups []*group, written *atomic.Int64) (res shardResult, err error) {
	var entries []checkpoint.Entry
	for _, g := range groups {
		entries = append(entries, g.Outputs...)
	}
	l, err := checkpoint.Layout(entries)
	if err != nil {
		return res, err
	}
	path := d.Join(rel)
	of, err := d.Create(rel)
	if err != nil {
		return res, err
	}
	defer func() {
		if err != nil {
			of.Abort()
		}
	}()
	f := of.File
	var length [8]byte
	binary.LittleEndian.PutUint64(length[:], uint64(len(l.Header)))
	if _, err = f.Write(append(length[:], l.Header...)); err != nil {
		return res, fmt.Errorf("writing %s: %w", path, err)
	}
	w := &countingWriter{f: f, n: written}
	for _, g := range groups {
		if err = ctx.Err(); err != nil {
			return res, err
		}
		if err = runGroup(ctx, g, w); err != nil {
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EDQUOT) {
				return res, fmt.Errorf("writing %s (%s): %w: free space on the output's filesystem and run the same command again (finished layers are kept)", path, g.Outputs[0].Name, err)
			}
			return res, fmt.Errorf("writing %s (%s): %w", path, g.Outputs[0].Name, err)
		}
	}
	if w.total != l.Size-8-int64(len(l.Header)) {
		return res, fmt.Errorf("writing %s: wrote %d tensor bytes, the header declares %d", path, w.total, l.Size-8-int64(len(l.Header)))
	}
	// No fsync here: a killed process loses nothing the kernel holds, and a
	// sync per shard would make Ctrl-C wait for the disk. finalize syncs
	// every shard before the index says the conversion is complete.
	if err = of.CommitUnsynced(); err != nil {
		return res, err
	}
	h := sha256.Sum256(l.Header)
	return shardResult{File: rel, Size: l.Size, HeaderHash: hex.EncodeToString(h[:]), Bytes: w.total}, nil
}

// countingWriter writes to the shard and counts bytes for the progress line.
type countingWriter struct {
	f     *os.File
	n     *atomic.Int64
	total int64
}

func (w *countingWriter) Write(b []byte) (int, error) {
	n, err := w.f.Write(b)
	w.total += int64(n)
	w.n.Add(int64(n))
	return n, err
}

func runGroup(ctx context.Context, g *group, w *countingWriter) error {
	switch g.Kind {
	case kindCopy:
		return copyBytes(ctx, g.src, w)
	case kindCast, kindFP8, kindDequant:
		return streamRows(ctx, g, w)
	case kindMXFP4:
		return streamMXFP4(ctx, g, w)
	case kindQuantBlk:
		return quantizeBlocks(ctx, g, w)
	case kindQuantChan:
		return quantizeChannels(ctx, g, w)
	}
	return fmt.Errorf("unknown group kind %q", g.Kind)
}

// copyBytes copies a tensor's stored bytes; between two files the kernel
// copies them (copy_file_range) without passing through user space.
func copyBytes(ctx context.Context, s *source, w *countingWriter) error {
	src, err := os.Open(s.Path)
	if err != nil {
		return err
	}
	defer src.Close()
	if _, err := src.Seek(s.Offset, io.SeekStart); err != nil {
		return err
	}
	for left := s.Length; left > 0; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(left, 4*chunkBytes)
		got, err := w.f.ReadFrom(io.LimitReader(src, n))
		w.total += got
		w.n.Add(got)
		if err != nil {
			return err
		}
		if got != n {
			return fmt.Errorf("%s: tensor %s ends early (truncated file?)", s.Path, s.Key)
		}
		left -= n
	}
	return nil
}

// matrix is a tensor seen as rows × cols (cols the last dimension).
func matrix(shape []int64) (rows, cols int64) {
	switch len(shape) {
	case 0:
		return 1, 1
	case 1:
		return 1, shape[0]
	}
	rows = 1
	for _, d := range shape[:len(shape)-1] {
		rows *= d
	}
	return rows, shape[len(shape)-1]
}

// rowReader decodes rows of a float or FP8 source tensor to float32,
// applying the FP8 scale when there is one; or gives the rows of a
// quantised weight computed by its View expression.
type rowReader struct {
	s       *source
	f       *os.File
	dt      string // the type of the rows as read
	data    []byte // the rows, when computed (float32), rather than read from f
	rows    int64
	cols    int64
	esize   int64
	buf     []byte
	scale   []float32 // FP8 scales, decoded
	mrows   int64     // rows of one matrix (the last two dimensions)
	sr, sc  int64     // scale grid of one matrix
	bm, bn  int64
	scalarS bool
}

func newRowReader(ctx context.Context, g *group) (*rowReader, error) {
	if g.weight != nil {
		e, err := g.view.Typed(g.weight)
		if err != nil {
			return nil, err
		}
		d, err := e.EvalContext(ctx, g.read)
		if err != nil {
			return nil, fmt.Errorf("dequantising %s: %w", e, err)
		}
		r := &rowReader{dt: "F32", esize: 4, data: d.Bytes}
		r.rows, r.cols = matrix(g.weight.Shape)
		return r, nil
	}
	f, err := os.Open(g.src.Path)
	if err != nil {
		return nil, err
	}
	r := &rowReader{s: g.src, f: f, dt: g.src.DType, esize: int64(elemBytes(g.src.DType))}
	r.rows, r.cols = matrix(g.src.Shape)
	if g.scale != nil {
		raw := make([]byte, g.scale.Length)
		sf, err := os.Open(g.scale.Path)
		if err != nil {
			f.Close()
			return nil, err
		}
		_, err = sf.ReadAt(raw, g.scale.Offset)
		sf.Close()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("reading %s: %w", g.scale.Key, err)
		}
		r.scale = decode(nil, g.scale.DType, raw)
		r.scalarS = len(r.scale) == 1
		r.bm, r.bn = g.blockRows, g.blockCols
		rank := len(g.src.Shape)
		if !r.scalarS {
			shape := g.scale.Shape
			if g.scaleShape != nil {
				shape = g.scaleShape
			}
			r.mrows = g.src.Shape[rank-2]
			r.sr, r.sc = shape[rank-2], shape[rank-1]
		}
	}
	return r, nil
}

func (r *rowReader) close() {
	if r.f != nil {
		r.f.Close()
	}
}

// readRaw reads rows [r0, r1) as stored (into a buffer reused), or slices
// them from the computed rows.
func (r *rowReader) readRaw(r0, r1 int64) ([]byte, error) {
	if r.data != nil {
		return r.data[r0*r.cols*r.esize : r1*r.cols*r.esize], nil
	}
	n := (r1 - r0) * r.cols * r.esize
	if int64(cap(r.buf)) < n {
		r.buf = make([]byte, n)
	}
	buf := r.buf[:n]
	if _, err := r.f.ReadAt(buf, r.s.Offset+r0*r.cols*r.esize); err != nil {
		return nil, fmt.Errorf("reading %s from %s: %w", r.s.Key, r.s.Path, err)
	}
	return buf, nil
}

// read decodes rows [r0, r1) into dst (reused).
func (r *rowReader) read(r0, r1 int64, dst []float32) ([]float32, error) {
	buf, err := r.readRaw(r0, r1)
	if err != nil {
		return nil, err
	}
	dst = decode(dst[:0], r.dt, buf)
	switch {
	case r.scale == nil:
	case r.scalarS:
		for i := range dst {
			dst[i] *= r.scale[0]
		}
	default:
		for row := r0; row < r1; row++ {
			m, rr := row/r.mrows, row%r.mrows
			srow := r.scale[(m*r.sr+rr/r.bm)*r.sc:]
			vals := dst[(row-r0)*r.cols : (row-r0+1)*r.cols]
			for c := range vals {
				vals[c] *= srow[int64(c)/r.bn]
			}
		}
	}
	return dst, nil
}

// rowsPerChunk is how many rows of cols float32 fit a chunk, rounded down to
// a multiple of align.
func rowsPerChunk(cols, align int64) int64 {
	n := max(1, chunkBytes/(4*max(cols, 1)))
	if align > 1 {
		n = max(align, n/align*align)
	}
	return n
}

func streamRows(ctx context.Context, g *group, w *countingWriter) error {
	r, err := newRowReader(ctx, g)
	if err != nil {
		return err
	}
	defer r.close()
	step := rowsPerChunk(r.cols, 1)
	var vals []float32
	var out []byte
	for r0 := int64(0); r0 < r.rows; r0 += step {
		if err := ctx.Err(); err != nil {
			return err
		}
		r1 := min(r.rows, r0+step)
		if r.data != nil && g.outDT == r.dt { // computed in the type asked: written as Eval gave it
			raw, _ := r.readRaw(r0, r1)
			if _, err := w.Write(raw); err != nil {
				return err
			}
			continue
		}
		if vals, err = r.read(r0, r1, vals); err != nil {
			return err
		}
		out = encode(out[:0], g.outDT, vals)
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
	return nil
}

// streamMXFP4 decodes gpt-oss MXFP4: each byte of blocks holds two E2M1
// codes (low nibble first), each group of 32 shares an E8M0 exponent.
func streamMXFP4(ctx context.Context, g *group, w *countingWriter) error {
	bf, err := os.Open(g.src.Path)
	if err != nil {
		return err
	}
	defer bf.Close()
	sf, err := os.Open(g.scale.Path)
	if err != nil {
		return err
	}
	defer sf.Close()
	shape := g.src.Shape
	r := len(shape)
	groups := shape[r-2]
	rowsTotal := int64(1)
	for _, d := range shape[:r-2] {
		rowsTotal *= d
	}
	cols := groups * 32
	// One matrix (expert) at a time when transposing, else chunks of rows.
	step := rowsPerChunk(cols, 1)
	mrows := rowsTotal
	if g.transpose {
		mrows = shape[r-3]
		step = mrows
	}
	blocks := make([]byte, 0)
	scales := make([]byte, 0)
	vals := make([]float32, 0)
	var tr []float32
	var out []byte
	for r0 := int64(0); r0 < rowsTotal; r0 += step {
		if err := ctx.Err(); err != nil {
			return err
		}
		r1 := min(rowsTotal, r0+step)
		n := r1 - r0
		blocks = grow(blocks, n*groups*16)
		scales = grow(scales, n*groups)
		if _, err := bf.ReadAt(blocks, g.src.Offset+r0*groups*16); err != nil {
			return fmt.Errorf("reading %s: %w", g.src.Key, err)
		}
		if _, err := sf.ReadAt(scales, g.scale.Offset+r0*groups); err != nil {
			return fmt.Errorf("reading %s: %w", g.scale.Key, err)
		}
		vals = vals[:0]
		for gi, e := range scales {
			f := float32(math.Ldexp(1, int(e)-127))
			for _, code := range blocks[gi*16 : gi*16+16] {
				vals = append(vals, fp4Values[code&0x0f]*f, fp4Values[code>>4]*f)
			}
		}
		if g.transpose { // [mrows, cols] -> [cols, mrows]
			if cap(tr) < len(vals) {
				tr = make([]float32, len(vals))
			}
			tr = tr[:len(vals)]
			for i := range n {
				for j := range cols {
					tr[j*n+i] = vals[i*cols+j]
				}
			}
			out = encode(out[:0], g.outDT, tr)
		} else {
			out = encode(out[:0], g.outDT, vals)
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
	return nil
}

func grow(b []byte, n int64) []byte {
	if int64(cap(b)) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// quantizeBlocks writes E4M3 weights, then float32 weight_scale_inv per
// 128×128 block, as transformers' Fp8Quantize computes them: scale =
// 448 / amax (1 for an all-zero block), q = clamp(w × scale, ±448),
// scale_inv = 1 / scale.
func quantizeBlocks(ctx context.Context, g *group, w *countingWriter) error {
	r, err := newRowReader(ctx, g)
	if err != nil {
		return err
	}
	defer r.close()
	inv := make([]float32, 0, ceilDiv(r.rows, blockSize)*ceilDiv(r.cols, blockSize))
	step := rowsPerChunk(r.cols, blockSize)
	bf16 := r.dt == "BF16" && r.scale == nil // the bits read as they are
	var vals []float32
	out := make([]byte, 0)
	for r0 := int64(0); r0 < r.rows; r0 += step {
		if err := ctx.Err(); err != nil {
			return err
		}
		r1 := min(r.rows, r0+step)
		if bf16 {
			raw, err := r.readRaw(r0, r1)
			if err != nil {
				return err
			}
			out = grow(out, int64(len(raw)/2))
			inv = quantBlockRowsBF16(raw, out, r.cols, inv)
		} else {
			if vals, err = r.read(r0, r1, vals); err != nil {
				return err
			}
			out = grow(out, int64(len(vals)))
			inv = quantBlockRows(vals, out, r.cols, inv)
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
	_, err = w.Write(encode(nil, "F32", inv))
	return err
}

// quantizeChannels writes E4M3 weights, then weight_scale [out, 1] in the
// model's float type, as compressed-tensors' FP8_DYNAMIC scheme (symmetric
// min-max per output channel): scale = amax / 448 rounded to its stored
// type (1 for an all-zero row), q = clamp(w / scale, ±448).
func quantizeChannels(ctx context.Context, g *group, w *countingWriter) error {
	r, err := newRowReader(ctx, g)
	if err != nil {
		return err
	}
	defer r.close()
	scales := make([]float32, 0, r.rows)
	step := rowsPerChunk(r.cols, 1)
	bf16 := r.dt == "BF16" && r.scale == nil // the bits read as they are
	channelScale := func(amax float32) float32 {
		s := roundTo(g.outDT, amax/fp8Max)
		if s == 0 || s != s || math.IsInf(float64(s), 0) {
			s = 1
		}
		scales = append(scales, s)
		return s
	}
	var vals []float32
	out := make([]byte, 0)
	for r0 := int64(0); r0 < r.rows; r0 += step {
		if err := ctx.Err(); err != nil {
			return err
		}
		r1 := min(r.rows, r0+step)
		if bf16 {
			raw, err := r.readRaw(r0, r1)
			if err != nil {
				return err
			}
			out = grow(out, int64(len(raw)/2))
			for row := range r1 - r0 {
				src, dst := raw[2*row*r.cols:2*(row+1)*r.cols], out[row*r.cols:(row+1)*r.cols]
				s := channelScale(math.Float32frombits(uint32(amaxBF16(src)) << 16))
				encodeBF16(dst, src, s, true)
			}
		} else {
			if vals, err = r.read(r0, r1, vals); err != nil {
				return err
			}
			out = grow(out, int64(len(vals)))
			for row := r0; row < r1; row++ {
				base := (row - r0) * r.cols
				s := channelScale(amaxBits(vals, r.cols, row-r0, row-r0+1, 0, r.cols))
				encodeDivided(out[base:base+r.cols], vals[base:base+r.cols], s)
			}
		}
		if _, err := w.Write(out); err != nil {
			return err
		}
	}
	_, err = w.Write(encode(nil, g.outDT, scales))
	return err
}

// quantBlockRows quantises rows of cols values (a whole number of 128-row
// blocks, or the last rows of the tensor) into out, appending each block's
// scale_inv to inv, row-block by row-block, column-block by column-block.
func quantBlockRows(vals []float32, out []byte, cols int64, inv []float32) []float32 {
	rows := int64(len(vals)) / cols
	for b0 := int64(0); b0 < rows; b0 += blockSize {
		b1 := min(rows, b0+blockSize)
		for c0 := int64(0); c0 < cols; c0 += blockSize {
			c1 := min(cols, c0+blockSize)
			amax := amaxBits(vals, cols, b0, b1, c0, c1)
			scale := float32(1)
			if amax > 0 {
				scale = fp8Max / amax
			}
			inv = append(inv, 1/scale)
			for row := b0; row < b1; row++ {
				encodeScaled(out[row*cols+c0:row*cols+c1], vals[row*cols+c0:row*cols+c1], scale)
			}
		}
	}
	return inv
}

// amaxBits is the largest |x| of a block, compared as bits (for finite
// floats the order of |x|'s bits is the order of the values).
func amaxBits(vals []float32, cols, r0, r1, c0, c1 int64) float32 {
	var m uint32
	for row := r0; row < r1; row++ {
		for _, x := range vals[row*cols+c0 : row*cols+c1] {
			if a := math.Float32bits(x) &^ (1 << 31); a > m {
				m = a
			}
		}
	}
	return math.Float32frombits(m)
}

// encodeScaled writes e4m3(x × scale) for each x.
func encodeScaled(dst []byte, src []float32, scale float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		y := x * scale
		code, ok := fastE4M3(math.Float32bits(y)) // inlined; e4m3 itself is a call
		if !ok {
			code = e4m3Ref(y)
		}
		dst[i] = code
	}
}

// encodeDivided writes e4m3(x / scale) for each x (a division, as
// compressed-tensors computes it, not a multiplication by the reciprocal).
func encodeDivided(dst []byte, src []float32, scale float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		y := x / scale
		code, ok := fastE4M3(math.Float32bits(y)) // inlined; e4m3 itself is a call
		if !ok {
			code = e4m3Ref(y)
		}
		dst[i] = code
	}
}

// The bfloat16 kernels read the source's bits directly: most conversions
// quantise bfloat16 releases, and skipping the float32 staging (decode,
// then two passes over it) halves the memory traffic. They give the bits
// the float32 path gives: a bfloat16 widens to float32 exactly.

// quantBlockRowsBF16 is quantBlockRows over bfloat16 rows src.
func quantBlockRowsBF16(src []byte, out []byte, cols int64, inv []float32) []float32 {
	rows := int64(len(src)) / (2 * cols)
	for b0 := int64(0); b0 < rows; b0 += blockSize {
		b1 := min(rows, b0+blockSize)
		for c0 := int64(0); c0 < cols; c0 += blockSize {
			c1 := min(cols, c0+blockSize)
			var m uint16
			for row := b0; row < b1; row++ {
				m = max(m, amaxBF16(src[2*(row*cols+c0):2*(row*cols+c1)]))
			}
			amax := math.Float32frombits(uint32(m) << 16)
			scale := float32(1)
			if amax > 0 {
				scale = fp8Max / amax
			}
			inv = append(inv, 1/scale)
			for row := b0; row < b1; row++ {
				encodeBF16(out[row*cols+c0:row*cols+c1], src[2*(row*cols+c0):2*(row*cols+c1)], scale, false)
			}
		}
	}
	return inv
}

// amaxBF16 is the largest |x| of bfloat16 values, as bits (their order is
// the values' for finite x).
func amaxBF16(src []byte) uint16 {
	var m0, m1, m2, m3 uint64 // four lanes of a 64-bit load
	i := 0
	if n := len(src) / 32 * 16; useAVX2 && n > 0 {
		var lanes [16]uint16
		amaxBF16AVX2(&src[0], n, &lanes)
		for _, l := range lanes {
			m0 = max(m0, uint64(l))
		}
		i = 2 * n
	}
	for ; i+8 <= len(src); i += 8 {
		u := binary.LittleEndian.Uint64(src[i:]) & 0x7fff7fff7fff7fff
		if a := u & 0xffff; a > m0 {
			m0 = a
		}
		if a := u >> 16 & 0xffff; a > m1 {
			m1 = a
		}
		if a := u >> 32 & 0xffff; a > m2 {
			m2 = a
		}
		if a := u >> 48; a > m3 {
			m3 = a
		}
	}
	m := max(m0, m1, m2, m3)
	for ; i+1 < len(src); i += 2 {
		m = max(m, uint64(binary.LittleEndian.Uint16(src[i:])&0x7fff))
	}
	return uint16(m)
}

// encodeBF16 writes e4m3(x × scale), or e4m3(x / scale) with divide, for
// each bfloat16 x of src: eight at a time in AVX2 where the CPU has it
// (redone here when a value left the kernel's fast range), else one by one.
func encodeBF16(dst []byte, src []byte, scale float32, divide bool) {
	n := len(dst)
	src = src[:2*n]
	start := 0
	if useAVX2 && n >= 8 {
		kernel := e4m3MulBF16AVX2
		if divide {
			kernel = e4m3DivBF16AVX2
		}
		if start = n &^ 7; kernel(&dst[0], &src[0], start, scale) {
			start = 0 // a subnormal, saturated or NaN value: the Go path for all
		}
	}
	for i := start; i < n; i++ {
		x := math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		if divide {
			dst[i] = e4m3(x / scale)
		} else {
			dst[i] = e4m3(x * scale)
		}
	}
}

// fastE4M3 is e4m3 of the float32 with bits b where 2^-6 ≤ |x| < 464: the
// exponent rebiased and the mantissa rounded to 3 bits, nearest even, in
// one integer step (it gives 0x7e, 448, from 448 up, as saturation does).
// ok is false when x is outside that range and the code is not e4m3's.
func fastE4M3(b uint32) (code uint8, ok bool) {
	a := b &^ (1 << 31)
	return uint8(b>>24)&0x80 | uint8((a+0x7ffff+(a>>20)&1-120<<23)>>20), a-0x3c800000 < 0x43e80000-0x3c800000
}
