package convert

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
)

func benchSrc(n int) []byte {
	rng := rand.New(rand.NewPCG(1, 1))
	src := make([]byte, 2*n)
	for i := 0; i < len(src); i += 2 {
		binary.LittleEndian.PutUint16(src[i:], bfloat16(float32(rng.NormFloat64())))
	}
	return src
}

func BenchmarkEncodeBF16(b *testing.B) {
	src := benchSrc(128)
	dst := make([]byte, 128)
	for _, avx := range []bool{false, true} {
		b.Run(map[bool]string{false: "scalar", true: "avx2"}[avx], func(b *testing.B) {
			saved := useAVX2
			useAVX2 = avx && saved
			defer func() { useAVX2 = saved }()
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				encodeBF16(dst, src, 100, false)
			}
		})
	}
}

func BenchmarkAmaxBF16(b *testing.B) {
	src := benchSrc(128)
	for _, avx := range []bool{false, true} {
		b.Run(map[bool]string{false: "scalar", true: "avx2"}[avx], func(b *testing.B) {
			saved := useAVX2
			useAVX2 = avx && saved
			defer func() { useAVX2 = saved }()
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				amaxBF16(src)
			}
		})
	}
}

func BenchmarkRawAVX2(b *testing.B) {
	for _, n := range []int{8, 128, 1024, 4096, 16384} {
		src := benchSrc(n)
		dst := make([]byte, n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			if !useAVX2 {
				b.Skip("no AVX2 on this machine")
			}
			for b.Loop() {
				e4m3MulBF16AVX2(&dst[0], &src[0], n, 100)
			}
		})
	}
}
