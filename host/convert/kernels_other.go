//go:build !amd64

package convert

// The AVX2 kernels exist on amd64 only; elsewhere the scalar loops run.
var useAVX2 = false

func e4m3MulBF16AVX2(dst, src *byte, n int, scale float32) bool { panic("no AVX2") }
func e4m3DivBF16AVX2(dst, src *byte, n int, scale float32) bool { panic("no AVX2") }
func amaxBF16AVX2(src *byte, n int, out *[16]uint16)            { panic("no AVX2") }
