package convert

import "golang.org/x/sys/cpu"

// AVX2 kernels (kernels_amd64.s) for the hot loops of FP8 quantisation of
// bfloat16 sources, written by hand because Go does not vectorise: on the
// project's 2-core machine the scalar loops ran at ~370 MB/s of bfloat16,
// which made fp8-block convert 2.5× slower than cp. They compute exactly
// the scalar kernels' bits (TestAVX2KernelsMatchTheScalarOnes).
var useAVX2 = cpu.X86.HasAVX2

//go:noescape
func e4m3MulBF16AVX2(dst, src *byte, n int, scale float32) (oob bool)

//go:noescape
func e4m3DivBF16AVX2(dst, src *byte, n int, scale float32) (oob bool)

//go:noescape
func amaxBF16AVX2(src *byte, n int, out *[16]uint16)
