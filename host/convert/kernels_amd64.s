#include "textflag.h"

// The AVX2 kernels of kernels_amd64.go, eight bfloat16 values per step.
// Each widens x to float32 (x<<16), scales it (SCALEOP: multiply or
// divide by the broadcast scale, IEEE single rounding as Go's float32),
// and forms the E4M3 code as fastE4M3 does:
//   a = |y| bits; code = sign | (a + lsb(a>>20) + 0x7ffff - 120<<23) >> 20
// flagging lanes with a outside [0x3c800000, 0x43e80000) (subnormal,
// saturated, NaN, infinite), which the Go caller redoes.

#define KERNEL(SCALEOP) \
	MOVQ dst+0(FP), DI \
	MOVQ src+8(FP), SI \
	MOVQ n+16(FP), CX \
	VBROADCASTSS scale+24(FP), Y15 \
	MOVL $0x7fffffff, AX \
	VMOVD AX, X14 \
	VPBROADCASTD X14, Y14 \
	MOVL $1, AX \
	VMOVD AX, X13 \
	VPBROADCASTD X13, Y13 \
	MOVL $0xc407ffff, AX \
	VMOVD AX, X12 \
	VPBROADCASTD X12, Y12 \
	MOVL $0x80, AX \
	VMOVD AX, X11 \
	VPBROADCASTD X11, Y11 \
	MOVL $0x3c800000, AX \
	VMOVD AX, X10 \
	VPBROADCASTD X10, Y10 \
	MOVL $0x43e7ffff, AX \
	VMOVD AX, X9 \
	VPBROADCASTD X9, Y9 \
	VPXOR Y7, Y7, Y7 \
	TESTQ CX, CX \
	JZ done \
loop: \
	VPMOVZXWD (SI), Y0 \
	VPSLLD $16, Y0, Y0 \
	SCALEOP Y15, Y0, Y0 \
	VPAND Y14, Y0, Y1 \
	VPCMPGTD Y1, Y10, Y5 \
	VPCMPGTD Y9, Y1, Y6 \
	VPOR Y5, Y7, Y7 \
	VPOR Y6, Y7, Y7 \
	VPSRLD $20, Y1, Y2 \
	VPAND Y13, Y2, Y2 \
	VPADDD Y1, Y2, Y2 \
	VPADDD Y12, Y2, Y2 \
	VPSRLD $20, Y2, Y2 \
	VPSRLD $24, Y0, Y3 \
	VPAND Y11, Y3, Y3 \
	VPOR Y3, Y2, Y2 \
	VPACKUSDW Y2, Y2, Y2 \
	VPACKUSWB Y2, Y2, Y2 \
	VEXTRACTI128 $1, Y2, X4 \
	VPUNPCKLDQ X4, X2, X2 \
	VMOVQ X2, (DI) \
	ADDQ $16, SI \
	ADDQ $8, DI \
	SUBQ $8, CX \
	JNZ loop \
done: \
	VPTEST Y7, Y7 \
	SETNE ret+32(FP) \
	VZEROUPPER \
	RET

// func e4m3MulBF16AVX2(dst, src *byte, n int, scale float32) (oob bool)
TEXT ·e4m3MulBF16AVX2(SB), NOSPLIT, $0-33
	KERNEL(VMULPS)

// func e4m3DivBF16AVX2(dst, src *byte, n int, scale float32) (oob bool)
TEXT ·e4m3DivBF16AVX2(SB), NOSPLIT, $0-33
	KERNEL(VDIVPS)

// func amaxBF16AVX2(src *byte, n int, out *[16]uint16)
// The lane-wise largest |x| bits of n bfloat16 values (n a multiple of 16).
TEXT ·amaxBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ src+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ out+16(FP), DI
	MOVL $0x7fff7fff, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14
	VPXOR Y1, Y1, Y1
	TESTQ CX, CX
	JZ amaxdone
amaxloop:
	VPAND (SI), Y14, Y0
	VPMAXUW Y0, Y1, Y1
	ADDQ $32, SI
	SUBQ $16, CX
	JNZ amaxloop
amaxdone:
	VMOVDQU Y1, (DI)
	VZEROUPPER
	RET
