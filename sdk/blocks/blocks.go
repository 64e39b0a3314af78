package blocks

import "github.com/strata-llm/strata/sdk/fn"

// Linear is an nn.Linear: weight [out, in] as stored in the checkpoint and an
// optional bias [out] ("" for none).
type Linear struct {
	Weight, Bias fn.Value
}

// Apply computes x·Wᵀ + b. The transpose is of a weight, so compilers fold it.
func (l Linear) Apply(f *fn.Func, x fn.Value) fn.Value {
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

// SwiGLU is Llama's MLP: down(silu(gate(x)) * up(x)).
type SwiGLU struct {
	Gate, Up, Down Linear
}

// Apply computes the MLP.
func (m SwiGLU) Apply(f *fn.Func, x fn.Value) fn.Value {
	gate := m.Gate.Apply(f.Scope("gate_proj"), x)
	up := m.Up.Apply(f.Scope("up_proj"), x)
	return m.Down.Apply(f.Scope("down_proj"), f.Mul(SiLU(f, gate), up))
}

// SiLU is x·sigmoid(x).
func SiLU(f *fn.Func, x fn.Value) fn.Value {
	return f.Mul(x, f.Sigmoid(x))
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
