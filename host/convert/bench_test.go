package convert

import (
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
