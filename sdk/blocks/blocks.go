package blocks

import (
	"fmt"
	"math"
	"slices"

	"github.com/strata-llm/strata/sdk/fn"
)

// Linear is an nn.Linear: weight [out, in] as stored in the checkpoint and an
// optional bias [out] ("" for none).
type Linear struct {
	Weight, Bias fn.Value
	// ORT computes it as ONNX Runtime's FusedMatMul (--target ort).
	ORT bool
}

// Apply computes x·Wᵀ + b. The transpose is of a weight, so compilers fold it.
func (l Linear) Apply(f *fn.Func, x fn.Value) fn.Value {
	if l.ORT {
		return l.applyORT(f, x)
	}
	// Gemm with transB over the rows of x: the weight is used as stored,
	// [out, in], so ONNX Runtime pre-packs it without folding a
	// transposed copy at every session creation.
	lead := f.Op("Shape", []fn.Value{x}, fn.AttrInt("end", -1)) // x's leading dims
	rows := f.Op("Flatten", []fn.Value{x}, fn.AttrInt("axis", -1))
	in := []fn.Value{rows, l.Weight}
	if l.Bias != "" {
		in = append(in, l.Bias)
	}
	y := f.Op("Gemm", in, fn.AttrInt("transB", 1))
	return f.Op("Reshape", []fn.Value{y, f.Concat(0, lead, f.Ints(-1))})
}

// LinearInputs declares the formal inputs of a Linear called name: the weight
// "<name>.weight" and, with bias, "<name>.bias". The returned names are what
// weight bindings refer to.
func LinearInputs(f *fn.Func, name string, bias bool) Linear {
	l := Linear{Weight: f.Input(name + ".weight")}
	if bias {
		l.Bias = f.Input(name + ".bias")
	}
	return l
}

// RMSNorm applies Llama-style RMSNorm as the CustomRMSNorm op the Qualcomm
// compiler knows, with its reference body shipped alongside.
func RMSNorm(f *fn.Func, x, weight fn.Value, eps float64) fn.Value {
	return f.Call(CustomRMSNormFunc(), []fn.Value{x, weight}, fn.AttrFloat("epsilon", float32(eps)))
}

// RMSNormOnePlus is Gemma's RMSNorm: x·rsqrt(mean(x²) + eps)·(1 + w),
// all of it in float32 and only then cast back to x's dtype, as
// transformers' Gemma3RMSNorm (whose weights are stored around 0). It is
// the CustomRMSNorm op on float32 operands, its weight 1 + w (a function
// of the weight alone, which compilers fold).
func RMSNormOnePlus(f *fn.Func, x, weight fn.Value, eps float64) fn.Value {
	dt := f.DType()
	w := f.Add(f.ScalarOf(fn.Float32, 1), f.CastTo(weight, dt, fn.Float32))
	return f.CastTo(RMSNorm(f, f.CastTo(x, dt, fn.Float32), w, eps), fn.Float32, dt)
}

// Norm is an RMSNorm's kind: the epsilon, and whether the weight is
// stored as an offset from 1 (Gemma: y·(1 + w), computed in float32).
type Norm struct {
	Eps     float64
	OnePlus bool
	// ORT computes it as ONNX Runtime's SimplifiedLayerNormalization
	// (--target ort; not with OnePlus, which that form refuses).
	ORT bool
}

// Apply norms x by weight: RMSNorm, or RMSNormOnePlus with OnePlus.
func (n Norm) Apply(f *fn.Func, x, weight fn.Value) fn.Value {
	switch {
	case n.OnePlus:
		return RMSNormOnePlus(f, x, weight, n.Eps)
	case n.ORT:
		return SimplifiedRMSNorm(f, x, weight, n.Eps)
	}
	return RMSNorm(f, x, weight, n.Eps)
}

// SwiGLU is Llama's MLP: down(act(gate(x)) * up(x)), act SiLU unless Act
// says otherwise (Gemma's GeGLU: ActGELUTanh).
type SwiGLU struct {
	Gate, Up, Down Linear
	Act            Activation
}

// Apply computes the MLP.
func (m SwiGLU) Apply(f *fn.Func, x fn.Value) fn.Value {
	gate := m.Gate.Apply(f.Scope("gate_proj"), x)
	up := m.Up.Apply(f.Scope("up_proj"), x)
	return m.Down.Apply(f.Scope("down_proj"), f.Mul(m.Act.Apply(f, gate), up))
}

// Activation is an MLP's activation by its transformers name (ACT2FN):
// ActSiLU ("" is SiLU too), ActGELUTanh, ActGELU.
type Activation string

// The activations Activation knows.
const (
	ActSiLU     Activation = "silu"
	ActGELUTanh Activation = "gelu_pytorch_tanh"
	ActGELU     Activation = "gelu"
)

// Activations lists the names Activation knows, for error messages.
var Activations = []Activation{ActSiLU, ActGELUTanh, ActGELU}

// Known reports whether a is an activation Apply computes.
func (a Activation) Known() bool { return a == "" || slices.Contains(Activations, a) }

// Apply computes the activation of x. SiLU runs in the compute dtype (as
// the gated MLPs always have); the GELUs in float32, cast back, as torch
// computes a bfloat16 GELU.
func (a Activation) Apply(f *fn.Func, x fn.Value) fn.Value {
	dt := f.DType()
	switch a {
	case "", ActSiLU:
		return SiLU(f, x)
	case ActGELUTanh:
		return f.CastTo(GELUTanh(f, f.CastTo(x, dt, fn.Float32), fn.Float32), fn.Float32, dt)
	case ActGELU:
		return f.CastTo(GELU(f, f.CastTo(x, dt, fn.Float32), fn.Float32), fn.Float32, dt)
	}
	panic(fmt.Sprintf("blocks: unknown activation %q (known: %v)", string(a), Activations))
}

// SiLU is x·sigmoid(x).
func SiLU(f *fn.Func, x fn.Value) fn.Value {
	return f.Mul(x, f.Sigmoid(x))
}

// GELUTanh is GELU with the tanh approximation (gelu_pytorch_tanh):
// x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³))), its constants of dtype t (x's).
func GELUTanh(f *fn.Func, x fn.Value, t fn.DType) fn.Value {
	cube := f.Mul(f.Mul(x, x), x)
	inner := f.Mul(f.Add(x, f.Mul(cube, f.ScalarOf(t, 0.044715))), f.ScalarOf(t, float32(math.Sqrt(2/math.Pi))))
	return f.Mul(f.Mul(x, f.ScalarOf(t, 0.5)), f.Add(f.ScalarOf(t, 1), f.Op("Tanh", []fn.Value{inner})))
}

// GELU is exact GELU (nn.GELU()): x/2·(1 + erf(x/√2)), its constants of
// dtype t (x's).
func GELU(f *fn.Func, x fn.Value, t fn.DType) fn.Value {
	erf := f.Op("Erf", []fn.Value{f.Mul(x, f.ScalarOf(t, float32(1/math.Sqrt2)))})
	return f.Mul(f.Mul(x, f.ScalarOf(t, 0.5)), f.Add(f.ScalarOf(t, 1), erf))
}

// Embedding looks token ids up in a [vocab, hidden] table.
func Embedding(f *fn.Func, table, ids fn.Value) fn.Value {
	return f.Gather(table, ids, 0)
}

// LastValidToken picks, per batch row, the hidden state of the token with the
// largest position id (padding is -1): [B,S,H] -> [B,1,H].
func LastValidToken(f *fn.Func, hidden, positionIDs fn.Value) fn.Value {
	last := f.ArgMax(positionIDs, 1, true) // [B,1]
	return f.Op("GatherND", []fn.Value{hidden, f.Unsqueeze(last, -1)}, fn.AttrInt("batch_dims", 1))
}
