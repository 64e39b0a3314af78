package transform

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// memory is a tensor store for expressions built in a test.
type memory map[string]Data

func (m memory) lookup(key string) (Type, error) {
	d, ok := m[key]
	if !ok {
		return Type{}, fmt.Errorf("no tensor %s", key)
	}
	return d.Type, nil
}

func (m memory) read(key string) ([]byte, error) { return m[key].Bytes, nil }

func (m memory) add(rng *rand.Rand, t dtype.DType, shape ...int64) *Expr {
	key := fmt.Sprintf("t%d", len(m))
	ty := Type{t, shape}
	b := make([]byte, ty.Bytes())
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	if t == onnxpb.TensorProto_FLOAT8E4M3FN {
		for i := range b { // no NaN codes: NaN payloads need not agree
			if b[i]&0x7f == 0x7f {
				b[i] &^= 1
			}
		}
	}
	if t == onnxpb.TensorProto_FLOAT {
		b = fromFloat32(t, func() []float32 {
			v := make([]float32, ty.Elements())
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			return v
		}())
	}
	m[key] = Data{ty, b}
	return Leaf(key)
}

// A stack of dequantised experts computes the same bits hoisted (one
// dequantisation of stacked operands) as per expert, for every dequant
// form strata writes; and it is hoisted when it can be.
func TestHoistDequantKeepsTheBits(t *testing.T) {
	f8, i32, u8, f32 := onnxpb.TensorProto_FLOAT8E4M3FN, onnxpb.TensorProto_INT32, onnxpb.TensorProto_UINT8, onnxpb.TensorProto_FLOAT
	experts := func(m memory, rng *rand.Rand, one func() *Expr) *Expr {
		e := &Expr{Op: OpStack}
		for range 3 {
			e.Args = append(e.Args, one())
		}
		return &Expr{Op: OpTranspose, Ints: []int64{0, 2, 1}, Args: []*Expr{e}}
	}
	cases := map[string]struct {
		build   func(m memory, rng *rand.Rand) *Expr
		hoisted string
	}{
		"fp8 partial blocks": {func(m memory, rng *rand.Rand) *Expr {
			return experts(m, rng, func() *Expr {
				return &Expr{Op: OpDequant, Ints: []int64{4, 4}, Args: []*Expr{m.add(rng, f8, 10, 6), m.add(rng, f32, 3, 2)}}
			})
		}, "transpose(dequant(stack("},
		"int4 groups with zero points": {func(m memory, rng *rand.Rand) *Expr {
			return experts(m, rng, func() *Expr {
				q := &Expr{Op: OpUnpackInt, Ints: []int64{4, 8}, Axis: -1, End: 16, Args: []*Expr{m.add(rng, i32, 9, 2)}}
				z := &Expr{Op: OpUnpackInt, Ints: []int64{4, 8}, Axis: 0, End: 9, Args: []*Expr{m.add(rng, i32, 2, 2)}}
				return &Expr{Op: OpDequant, Ints: []int64{1, 8}, Args: []*Expr{q, m.add(rng, f32, 9, 2), z}}
			})
		}, "transpose(dequant(unpack_int(stack("},
		"nvfp4, each expert its second scale": {func(m memory, rng *rand.Rand) *Expr {
			return experts(m, rng, func() *Expr {
				s := &Expr{Op: OpMul, Args: []*Expr{m.add(rng, f8, 4, 2), m.add(rng, f32, 1)}}
				return &Expr{Op: OpDequant, Ints: []int64{1, 16}, Args: []*Expr{{Op: OpUnpackFP4, Args: []*Expr{m.add(rng, u8, 4, 16)}}, s}}
			})
		}, "transpose(dequant(unpack_fp4(stack("},
		"per-tensor scales stay per expert": {func(m memory, rng *rand.Rand) *Expr {
			return experts(m, rng, func() *Expr {
				return &Expr{Op: OpDequant, Args: []*Expr{m.add(rng, f8, 4, 4), m.add(rng, f32, 1)}}
			})
		}, "transpose(stack(dequant("},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			m := memory{}
			plain := tc.build(m, rng)
			if err := plain.Infer(m.lookup); err != nil {
				t.Fatal(err)
			}
			want, err := plain.Eval(m.read)
			if err != nil {
				t.Fatal(err)
			}
			// The same expression built again (same keys, same draws).
			hoisted := tc.build(memory{}, rand.New(rand.NewPCG(1, 2)))
			if err := hoisted.Infer(m.lookup); err != nil {
				t.Fatal(err)
			}
			hoisted = hoisted.HoistDequant()
			// The table types what hoisting added only (InferNew): the new
			// nodes sit under typed ones, and must be typed as Infer would.
			if err := hoisted.InferNew(m.lookup); err != nil {
				t.Fatalf("%s: %v", hoisted, err)
			}
			typed := types(hoisted)
			if err := hoisted.Infer(m.lookup); err != nil {
				t.Fatalf("%s: %v", hoisted, err)
			}
			if again := types(hoisted); typed != again {
				t.Errorf("InferNew typed %s as\n%s\nInfer as\n%s", hoisted, typed, again)
			}
			if !strings.HasPrefix(hoisted.String(), tc.hoisted) {
				t.Errorf("hoisted to %s, want %s...", hoisted, tc.hoisted)
			}
			got, err := hoisted.Eval(m.read)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes, want.Bytes) {
				t.Errorf("%s computes other bits than %s", hoisted, plain)
			}
		})
	}
}

// types lists every node's type, depth first.
func types(e *Expr) string {
	var b strings.Builder
	e.walk(func(x *Expr) { fmt.Fprintf(&b, "%s %v %v\n", x.Op, x.Type.DType, x.Type.Shape) })
	return b.String()
}
