package transform

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/internal/testbin"
	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

func lookupIn(ckpt *checkpoint.Checkpoint) Lookup {
	return func(key string) (Type, error) {
		t, ok := ckpt.Tensor(key)
		if !ok {
			return Type{}, os.ErrNotExist
		}
		info, _ := dtype.FromSafetensors(t.DType)
		return Type{info.ONNX, t.Shape}, nil
	}
}

// The Go lowering reproduces transformers' MXFP4 and FP8 dequantisation bit
// for bit (the fixture holds transformers' outputs; see generate.py).
func TestEvalMatchesTransformers(t *testing.T) {
	dir := filepath.Join(testbin.Root(), "conformance", "fixtures", "transforms")
	data, err := os.ReadFile(filepath.Join(dir, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name     string `json:"name"`
		Expr     *Expr  `json:"expr"`
		Expected string `json:"expected"`
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	ckpt, err := checkpoint.OpenFile(filepath.Join(dir, "inputs.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if err := c.Expr.Infer(lookupIn(ckpt)); err != nil {
				t.Fatal(err)
			}
			got, err := c.Expr.Eval(ckpt.ReadTensor)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ckpt.ReadTensor(c.Expected)
			if err != nil {
				t.Fatal(err)
			}
			if !sameFloats(got.Type.DType, got.Bytes, want) {
				t.Errorf("%s differs from transformers", c.Expr)
			}
		})
	}
}

// sameFloats compares bit for bit, any NaN equal to any NaN.
func sameFloats(t dtype.DType, a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := toFloat32(t, a), toFloat32(t, b)
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) && !(x[i] != x[i] && y[i] != y[i]) {
			return false
		}
	}
	return true
}

func TestDecodeTables(t *testing.T) {
	cases := map[string]struct {
		t    dtype.DType
		b    uint8
		want float64
	}{
		"e4m3 one":       {onnxpb.TensorProto_FLOAT8E4M3FN, 0x38, 1},
		"e4m3 max":       {onnxpb.TensorProto_FLOAT8E4M3FN, 0x7e, 448},
		"e4m3 min sub":   {onnxpb.TensorProto_FLOAT8E4M3FN, 0x01, math.Ldexp(1, -9)},
		"e4m3 negative":  {onnxpb.TensorProto_FLOAT8E4M3FN, 0xb8, -1},
		"e5m2 one":       {onnxpb.TensorProto_FLOAT8E5M2, 0x3c, 1},
		"e5m2 max":       {onnxpb.TensorProto_FLOAT8E5M2, 0x7b, 57344},
		"e5m2 inf":       {onnxpb.TensorProto_FLOAT8E5M2, 0x7c, math.Inf(1)},
		"e8m0 one":       {onnxpb.TensorProto_FLOAT8E8M0, 127, 1},
		"exponent byte":  {onnxpb.TensorProto_UINT8, 130, 8},
		"exponent 2^128": {onnxpb.TensorProto_UINT8, 255, math.Inf(1)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := codeTable(tc.t)[tc.b]; float64(got) != tc.want {
				t.Errorf("decode %#x = %g, want %g", tc.b, got, tc.want)
			}
		})
	}
	for _, nan := range []struct {
		t dtype.DType
		b uint8
	}{{onnxpb.TensorProto_FLOAT8E4M3FN, 0x7f}, {onnxpb.TensorProto_FLOAT8E4M3FN, 0xff}, {onnxpb.TensorProto_FLOAT8E5M2, 0x7d}, {onnxpb.TensorProto_FLOAT8E8M0, 255}} {
		if v := codeTable(nan.t)[nan.b]; v == v {
			t.Errorf("%s %#x decodes to %g, want NaN", dtype.Name(nan.t), nan.b, v)
		}
	}
}

func TestBFloat16RoundsToNearestEven(t *testing.T) {
	cases := map[float32]uint16{
		1:                                0x3f80,
		math.Float32frombits(0x3f808000): 0x3f80, // tie, even stays
		math.Float32frombits(0x3f818000): 0x3f82, // tie, odd rounds up
		math.Float32frombits(0x3f808001): 0x3f81, // above the tie
	}
	for in, want := range cases {
		if got := bfloat16(in); got != want {
			t.Errorf("bfloat16(%#x) = %#x, want %#x", math.Float32bits(in), got, want)
		}
	}
}

func TestInferErrors(t *testing.T) {
	types := map[string]Type{
		"w":      {onnxpb.TensorProto_BFLOAT16, []int64{4, 6}},
		"v":      {onnxpb.TensorProto_BFLOAT16, []int64{4, 5}},
		"f32":    {onnxpb.TensorProto_FLOAT, []int64{4, 6}},
		"u8":     {onnxpb.TensorProto_UINT8, []int64{2, 3, 16}},
		"scales": {onnxpb.TensorProto_UINT8, []int64{2, 4}},
		"fp8":    {onnxpb.TensorProto_FLOAT8E4M3FN, []int64{256, 256}},
		"grid":   {onnxpb.TensorProto_FLOAT, []int64{3, 2}},
		"i32":    {onnxpb.TensorProto_INT32, []int64{4, 2}},
	}
	lookup := func(k string) (Type, error) {
		if t, ok := types[k]; ok {
			return t, nil
		}
		return Type{}, os.ErrNotExist
	}
	op := func(name string, args ...*Expr) *Expr { return &Expr{Op: name, Args: args} }
	cases := map[string]struct {
		e    *Expr
		want string
	}{
		"unknown op":            {op("frobnicate", Leaf("w")), `unknown weight transform "frobnicate"`},
		"missing key":           {Leaf("nope"), "file does not exist"},
		"cast to int":           {Cast(Leaf("w"), "int32"), `cast to "int32"`},
		"cast bytes":            {Cast(Leaf("u8"), "float32"), "needs its dequantising transform"},
		"cast fp8":              {Cast(Leaf("fp8"), "float32"), "never a plain cast"},
		"block grid too small":  {&Expr{Op: OpDequant, Args: []*Expr{Leaf("fp8"), Leaf("grid")}, Ints: []int64{128, 128}}, "is not the grid of [128 128] blocks"},
		"block of one size":     {&Expr{Op: OpDequant, Args: []*Expr{Leaf("fp8"), Leaf("grid")}, Ints: []int64{128}}, "give rows and columns"},
		"zero point shape":      {op(OpDequant, Leaf("fp8"), Leaf("grid"), Leaf("w")), "zero point [4 6] must have the scale's shape"},
		"unpack float":          {&Expr{Op: OpUnpackInt, Args: []*Expr{Leaf("w")}, Ints: []int64{4, 8}}, "unpacks int32 words"},
		"unpack bits":           {&Expr{Op: OpUnpackInt, Args: []*Expr{Leaf("i32")}, Ints: []int64{3, 4}}, "bits 2, 4 or 8"},
		"unpack too long":       {&Expr{Op: OpUnpackInt, Args: []*Expr{Leaf("i32")}, Ints: []int64{4, 8}, Axis: 1, End: 99}, "do not pack into"},
		"unpack fp4 of floats":  {op(OpUnpackFP4, Leaf("w")), "unpacks U8 bytes"},
		"mul shapes":            {op(OpMul, Leaf("w"), Leaf("v")), "neither one value nor of shape"},
		"bad permutation":       {&Expr{Op: OpTranspose, Args: []*Expr{Leaf("w")}, Ints: []int64{0, 0}}, "not a permutation"},
		"reshape count":         {&Expr{Op: OpReshape, Args: []*Expr{Leaf("w")}, Ints: []int64{5, 5}}, "cannot reshape"},
		"stack shapes":          {op(OpStack, Leaf("w"), Leaf("v")), "argument 1 has shape [4 5]"},
		"stack dtypes":          {op(OpStack, Leaf("w"), Leaf("f32")), "argument 1 is float32"},
		"concat mismatch":       {&Expr{Op: OpConcat, Args: []*Expr{Leaf("w"), Leaf("v")}, Axis: 0}, "incompatible"},
		"slice past end":        {&Expr{Op: OpSlice, Args: []*Expr{Leaf("w")}, Axis: 1, Start: 2, End: 9}, "slice [2:9:1] of a dimension of 6"},
		"axis out of range":     {&Expr{Op: OpConcat, Args: []*Expr{Leaf("w")}, Axis: 3}, "axis 3 out of range"},
		"mxfp4 shape":           {op(OpMXFP4, Leaf("u8"), Leaf("scales")), "blocks must be [..., G, 16]"},
		"mxfp4 types":           {op(OpMXFP4, Leaf("w"), Leaf("scales")), "needs U8 blocks"},
		"fp8 not a grid":        {op(OpFP8, Leaf("fp8"), Leaf("grid")), "is not a block grid"},
		"fp8 of a float weight": {op(OpFP8, Leaf("w"), Leaf("grid")), "needs an F8_E4M3 or F8_E5M2 weight"},
		"too many args":         {op(OpCast, Leaf("w"), Leaf("w")), "cast takes 1 argument(s), got 2"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.e.Infer(lookup)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCanonicalTellsExpressionsApart(t *testing.T) {
	a, b := Leaf("a"), Leaf("b")
	distinct := []*Expr{
		a,
		b,
		Leaf(`a"`),
		Leaf("a,b"),
		Cast(a, "float32"),
		Cast(a, "float16"),
		{Op: OpTranspose, Args: []*Expr{a}, Ints: []int64{1, 0}},
		{Op: OpTranspose, Args: []*Expr{a}, Ints: []int64{10}},
		{Op: OpReshape, Args: []*Expr{a}, Ints: []int64{1, 0}},
		{Op: OpStack, Args: []*Expr{a, b}},
		{Op: OpStack, Args: []*Expr{b, a}},
		{Op: OpStack, Args: []*Expr{a, b}, Axis: 1},
		{Op: OpConcat, Args: []*Expr{a, b}},
		{Op: OpConcat, Args: []*Expr{{Op: OpConcat, Args: []*Expr{a}}, b}},
		{Op: OpConcat, Args: []*Expr{{Op: OpConcat, Args: []*Expr{a, b}}}},
		{Op: OpSlice, Args: []*Expr{a}, Start: 1, End: 2, Step: 1},
		{Op: OpSlice, Args: []*Expr{a}, Start: 12, Step: 1},
		{Op: OpSlice, Args: []*Expr{a}, Start: 1, End: 21},
	}
	seen := map[[32]byte]int{}
	for i, e := range distinct {
		c := e.Digest()
		if j, ok := seen[c]; ok {
			t.Errorf("expressions %d (%s) and %d (%s) have the same digest %x", j, distinct[j], i, e, c)
		}
		seen[c] = i
		same := &Expr{Key: e.Key, Op: e.Op, Args: e.Args, Ints: append([]int64(nil), e.Ints...), Axis: e.Axis, Start: e.Start, End: e.End, Step: e.Step, To: e.To}
		if got := same.Digest(); got != c {
			t.Errorf("a copy of %s has digest %x, want %x", e, got, c)
		}
	}
}

// evalTranspose moves every element where a naive index-by-index transpose
// puts it, for every permutation of ranks 1 to 4 and element sizes 1 to 8.
func TestTransposeMatchesNaive(t *testing.T) {
	shape := []int64{3, 1, 4, 2}
	for _, dt := range []onnxpb.TensorProto_DataType{onnxpb.TensorProto_UINT8, onnxpb.TensorProto_BFLOAT16, onnxpb.TensorProto_FLOAT, onnxpb.TensorProto_DOUBLE} {
		for rank := 1; rank <= len(shape); rank++ {
			for _, perm := range permutations(rank) {
				in := Type{DType: dt, Shape: shape[:rank]}
				size := int64(elemSize(dt))
				src := make([]byte, in.Elements()*size)
				for i := range src {
					src[i] = byte(i*7 + 3)
				}
				outShape := make([]int64, rank)
				for i, p := range perm {
					outShape[i] = in.Shape[p]
				}
				e := &Expr{Op: OpTranspose, Ints: perm, Type: Type{DType: dt, Shape: outShape}}
				got := evalTranspose(e, []Data{{in, src}})
				want := make([]byte, len(src))
				inStrides, outStrides := strides(in.Shape), strides(outShape)
				for o := int64(0); o < in.Elements(); o++ {
					var s int64
					for i, p := range perm {
						s += (o / outStrides[i] % outShape[i]) * inStrides[p]
					}
					copy(want[o*size:(o+1)*size], src[s*size:(s+1)*size])
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%v %v perm %v: %v, want %v", dt, in.Shape, perm, got, want)
				}
			}
		}
	}
}

func permutations(n int) [][]int64 {
	if n == 1 {
		return [][]int64{{0}}
	}
	var out [][]int64
	for _, p := range permutations(n - 1) {
		for at := 0; at <= len(p); at++ {
			q := append(append(append([]int64{}, p[:at]...), int64(n-1)), p[at:]...)
			out = append(out, q)
		}
	}
	return out
}
