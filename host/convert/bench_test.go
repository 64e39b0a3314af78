package convert

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

func BenchmarkQuantizeBlockKernel(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const rows, cols = 128, 4096
	vals := make([]float32, rows*cols)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64())
	}
	out := make([]byte, len(vals))
	b.SetBytes(int64(len(vals)) * 2)
	for b.Loop() {
		quantBlockRows(vals, out, cols, nil)
	}
}

func BenchmarkDecodeBF16(b *testing.B) {
	src := make([]byte, 2*128*4096)
	dst := make([]float32, 0, 128*4096)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		dst = decode(dst[:0], "BF16", src)
	}
}

func TestE4M3FastMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for range 1_000_000 {
		x := float32(rng.NormFloat64() * 100)
		if rng.IntN(4) == 0 {
			x = float32(rng.NormFloat64() * 0.01)
		}
		if got, want := e4m3(x), e4m3Ref(x); got != want {
			t.Fatalf("e4m3(%g) = %#x, reference %#x", x, got, want)
		}
	}
	for c := range 256 { // every code and every midpoint between neighbours
		v := e4m3Values[c]
		if v != v {
			continue
		}
		next := e4m3Values[(c+1)%256]
		for _, x := range []float32{v, (v + next) / 2} {
			if got, want := e4m3(x), e4m3Ref(x); got != want {
				t.Fatalf("e4m3(%g) = %#x, reference %#x", x, got, want)
			}
		}
	}
}

func BenchmarkQuantizeBlockKernelBF16(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const rows, cols = 128, 4096
	src := make([]byte, 2*rows*cols)
	for i := 0; i < len(src); i += 2 {
		binary.LittleEndian.PutUint16(src[i:], bfloat16(float32(rng.NormFloat64())))
	}
	out := make([]byte, rows*cols)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		quantBlockRowsBF16(src, out, cols, nil)
	}
}

// The bfloat16 kernel gives the float32 path's bits, scales included,
// over values that reach every branch (zeros, subnormals, saturation,
// NaN and infinities, a ragged last block).
func TestBF16BlockKernelMatchesTheFloat32Path(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	const rows, cols = 200, 300
	src := make([]byte, 2*rows*cols)
	for i := 0; i < len(src); i += 2 {
		x := float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(9)-4)))
		switch rng.IntN(500) {
		case 0:
			x = 0
		case 1:
			x = float32(math.Inf(1 - 2*rng.IntN(2)))
		case 2:
			x = float32(math.NaN())
		}
		binary.LittleEndian.PutUint16(src[i:], bfloat16(x))
	}
	want, got := make([]byte, rows*cols), make([]byte, rows*cols)
	vals := decode(nil, "BF16", src)
	for _, scale := range []float32{0.37, 448, 3e-5} { // fp8-dynamic's per-channel division
		encodeDivided(want, vals, scale)
		encodeBF16(got, src, scale, true)
		if !bytes.Equal(got, want) {
			t.Fatalf("divided by %g: codes differ", scale)
		}
	}
	for row := range rows {
		a, b := amaxBits(vals, cols, int64(row), int64(row)+1, 0, cols), math.Float32frombits(uint32(amaxBF16(src[2*row*cols:2*(row+1)*cols]))<<16)
		if math.Float32bits(a) != math.Float32bits(b) {
			t.Fatalf("row %d: amax %g, bfloat16 kernel %g", row, a, b)
		}
	}
	wantInv := quantBlockRows(vals, want, cols, nil)
	gotInv := quantBlockRowsBF16(src, got, cols, nil)
	if !bytes.Equal(got, want) {
		t.Fatal("codes differ")
	}
	for i := range wantInv {
		if math.Float32bits(gotInv[i]) != math.Float32bits(wantInv[i]) && !(gotInv[i] != gotInv[i] && wantInv[i] != wantInv[i]) {
			t.Fatalf("scale_inv %d: %g, want %g", i, gotInv[i], wantInv[i])
		}
	}
}

// The AVX2 kernels give the scalar kernels' bits: codes, out-of-range
// flags and amax, over random and edge values and every length mod 16.
func TestAVX2KernelsMatchTheScalarOnes(t *testing.T) {
	if !useAVX2 {
		t.Log("no AVX2 on this machine: the scalar kernels run (and are what the other tests check)")
		return
	}
	rng := rand.New(rand.NewPCG(4, 4))
	for _, n := range []int{8, 16, 24, 40, 128, 1000, 4104} {
		src := make([]byte, 2*n)
		for i := 0; i < len(src); i += 2 {
			x := float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(9)-4)))
			switch rng.IntN(50) {
			case 0:
				x = 0
			case 1:
				x = float32(math.Inf(1 - 2*rng.IntN(2)))
			case 2:
				x = float32(math.NaN())
			case 3:
				x = -x * 1e-6
			}
			binary.LittleEndian.PutUint16(src[i:], bfloat16(x))
		}
		for _, scale := range []float32{448, 0.37, 3e-5, 1} {
			m := n &^ 7
			for _, k := range []struct {
				name string
				avx  func(dst, src *byte, n int, scale float32) bool
				op   func(x float32) float32
			}{
				{"multiply", e4m3MulBF16AVX2, func(x float32) float32 { return x * scale }},
				{"divide", e4m3DivBF16AVX2, func(x float32) float32 { return x / scale }},
			} {
				got := make([]byte, n)
				oob := k.avx(&got[0], &src[0], m, scale)
				wantOOB := false
				for i := range m {
					code, ok := fastE4M3(math.Float32bits(k.op(math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16))))
					wantOOB = wantOOB || !ok
					if ok && got[i] != code {
						t.Fatalf("%s n=%d scale=%g: code %d = %#x, want %#x", k.name, n, scale, i, got[i], code)
					}
				}
				if oob != wantOOB {
					t.Fatalf("%s n=%d scale=%g: out of range %v, want %v", k.name, n, scale, oob, wantOOB)
				}
			}
		}
		var lanes [16]uint16
		if m := n / 16 * 16; m > 0 {
			amaxBF16AVX2(&src[0], m, &lanes)
			var got, want uint16
			for _, l := range lanes {
				got = max(got, l)
			}
			for i := 0; i < 2*m; i += 2 {
				want = max(want, binary.LittleEndian.Uint16(src[i:])&0x7fff)
			}
			if got != want {
				t.Fatalf("n=%d: amax %#x, want %#x", n, got, want)
			}
		}
	}
}
