package blocks

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/strata-llm/strata/sdk/fn"
)

// GatedDeltaNet is the linear attention of Qwen3-Next and Qwen3.5
// (transformers' *GatedDeltaNet): projections, a causal depthwise conv1d
// over q, k and v with its state, q/k L2 norms, the gated delta rule over a
// recurrent state per value head, a gated RMSNorm, the output projection.
//
// The delta rule of one call is computed in its parallel (WY) form over the
// whole call, no loop: with decays G (cumulated log gates), A the strictly
// lower triangular β·k·kᵀ·decay, (I + A)⁻¹ is the product
// (I + N)(I + N²)(I + N⁴)… of N = -A, exact once 2^J ≥ seq_len (N is
// nilpotent: its powers from the seq_len-th on are exactly zero). J is
// fixed when the graph is built (MaxSeqLen); a call longer than MaxSeqLen
// returns NaN, never a wrong number. A decode step is the same graph at
// seq_len 1.
type GatedDeltaNet struct {
	KHeads, VHeads, KDim, VDim int // linear_num_{key,value}_heads, linear_{key,value}_head_dim
	Kernel                     int // linear_conv_kernel_dim
	QKV, Z, B, A, Out          Linear
	Conv                       fn.Value // conv1d.weight [channels, 1, kernel]
	ALog, DtBias               fn.Value // [VHeads]
	Norm                       fn.Value // norm.weight [VDim], weighing by w
	NormEps                    float64
	MaxSeqLen                  int // a power of 2: the longest call the parallel form is exact for
}

// StateContext is what linear attention reads of the model level: positions
// (-1 padding), batch_index rows (continuous batching, or ""), and the
// layer's states conv [R, channels, kernel] and recurrent [R, VHeads, KDim,
// VDim].
type StateContext struct {
	PositionIDs, BatchIndex fn.Value
	Conv, Recurrent         fn.Value
}

// Channels is the conv's width: q, k and v.
func (g GatedDeltaNet) Channels() int { return 2*g.KHeads*g.KDim + g.VHeads*g.VDim }

// Check refuses shapes the block cannot compute.
func (g GatedDeltaNet) Check() error {
	switch {
	case g.KHeads <= 0 || g.VHeads <= 0 || g.KDim <= 0 || g.VDim <= 0:
		return fmt.Errorf("linear attention heads and head dims must be positive (got %d×%d keys, %d×%d values)", g.KHeads, g.KDim, g.VHeads, g.VDim)
	case g.VHeads%g.KHeads != 0:
		return fmt.Errorf("linear_num_value_heads (%d) must be a multiple of linear_num_key_heads (%d)", g.VHeads, g.KHeads)
	case g.Kernel < 1:
		return fmt.Errorf("linear_conv_kernel_dim must be positive, got %d", g.Kernel)
	case g.MaxSeqLen < 1 || bits.OnesCount(uint(g.MaxSeqLen)) != 1:
		return fmt.Errorf("the delta rule's longest call must be a power of 2, got %d", g.MaxSeqLen)
	}
	return nil
}

// Apply computes the block on x [B,S,H] (normed). Rows whose positions are
// all -1 keep their states; a row whose positions hold 0 starts from zero
// states. The valid tokens of a row are the first ones of the call (right
// padding, as QEfficient pads).
func (g GatedDeltaNet) Apply(f *fn.Func, x fn.Value, c StateContext) (out, conv, recurrent fn.Value) {
	dt := f.DType()
	valid := f.Cast(f.Greater(c.PositionIDs, f.Int(-1)), fn.Float32) // [B,S]
	fresh := f.Greater(f.ReduceMax(f.Cast(f.Op("Equal", []fn.Value{c.PositionIDs, f.Int(0)}), fn.Float32), true, 1), f.ScalarOf(fn.Float32, 0))
	convIn := startState(f.Scope("conv_state"), c.Conv, c.BatchIndex, f.Reshape(fresh, -1, 1, 1), dt)
	recIn := f.CastTo(startState(f.Scope("recurrent_state"), c.Recurrent, c.BatchIndex, f.Reshape(fresh, -1, 1, 1, 1), dt), dt, fn.Float32)

	qkv := g.QKV.Apply(f.Scope("in_proj_qkv"), x)
	qkv = f.Mul(qkv, f.Unsqueeze(f.CastTo(valid, fn.Float32, dt), -1)) // padding inputs are zero
	mixed, convOut := g.conv(f.Scope("conv1d"), qkv, convIn, valid)

	q, k, v := g.heads(f.Scope("heads"), mixed, valid)
	beta := f.Mul(f.Sigmoid(f.CastTo(g.B.Apply(f.Scope("in_proj_b"), x), dt, fn.Float32)), f.Unsqueeze(valid, -1))
	gate := g.decay(f.Scope("decay"), g.A.Apply(f.Scope("in_proj_a"), x), valid)
	core, recOut := g.deltaRule(f.Scope("delta_rule"), q, k, v, f.Transpose(beta, 0, 2, 1), f.Transpose(gate, 0, 2, 1), recIn)

	y := g.gatedNorm(f.Scope("norm"), core, g.Z.Apply(f.Scope("in_proj_z"), x))
	out = g.Out.Apply(f.Scope("out_proj"), y)
	conv = writeState(f.Scope("conv_state"), c.Conv, c.BatchIndex, convOut)
	recurrent = writeState(f.Scope("recurrent_state"), c.Recurrent, c.BatchIndex, f.CastTo(recOut, fn.Float32, dt))
	return out, conv, recurrent
}

// startState is the rows of state the call reads (batch_index's with
// continuous batching), zero for rows starting fresh (bool [B,1,…] of the
// state's rank).
func startState(f *fn.Func, state, batchIndex, fresh fn.Value, dt fn.DType) fn.Value {
	rows := state
	if batchIndex != "" {
		rows = f.Gather(state, f.Reshape(batchIndex, -1), 0)
	}
	return f.Where(fresh, f.ScalarOf(dt, 0), rows)
}

// writeState is the state input with the call's rows replaced.
func writeState(f *fn.Func, state, batchIndex, rows fn.Value) fn.Value {
	if batchIndex == "" {
		return rows
	}
	return f.Op("ScatterND", []fn.Value{state, batchIndex, rows})
}

// conv is the causal depthwise conv1d of qkv [B,S,C] continuing state [B,C,K]
// and its SiLU [B,S,C], and the new state: the last K inputs of the row's
// valid tokens (selected by a one-hot matmul, exact).
func (g GatedDeltaNet) conv(f *fn.Func, qkv, state, valid fn.Value) (mixed, newState fn.Value) {
	xt := f.Transpose(qkv, 0, 2, 1) // [B,C,S]
	seq := f.Concat(2, state, xt)   // [B,C,K+S]
	y := f.Op("Conv", []fn.Value{seq, g.Conv}, fn.AttrInt("group", int64(g.Channels())))
	y = f.Op("Slice", []fn.Value{y, f.Ints(1), f.Ints(math.MaxInt64), f.Ints(2)}) // the last S of S+1
	mixed = f.Transpose(SiLU(f, y), 0, 2, 1)

	k := int64(g.Kernel)
	kIota := make([]float32, k)
	for i := range kIota {
		kIota[i] = float32(i)
	}
	count := f.Unsqueeze(f.ReduceSum(valid, true, 1), -1)          // [B,1,1] valid tokens
	target := f.Add(count, f.Reshape(f.Floats(kIota...), 1, 1, k)) // [B,1,K]: index into [state, x]
	fromState := f.Op("Equal", []fn.Value{f.Reshape(f.Floats(kIota...), 1, k, 1), target})
	fromX := f.Op("Equal", []fn.Value{f.Unsqueeze(f.Add(iota(f, valid), f.ScalarOf(fn.Float32, float32(k))), -1), target})
	dt := f.DType()
	newState = f.Add(f.MatMul(state, f.Cast(fromState, dt)), f.MatMul(xt, f.Cast(fromX, dt)))
	return mixed, newState
}

// iota is 0..S-1 [B,S] float32 for valid [B,S] (a row of ones summed
// over the strictly lower triangle: no Range, no CumSum).
func iota(f *fn.Func, valid fn.Value) fn.Value {
	ones := f.OnesLike(valid, fn.Float32)
	return f.ReduceSum(f.Mul(f.Unsqueeze(ones, 1), f.Unsqueeze(triangle(f, ones, -1), 0)), false, 2)
}

// triangle is the [S,S] float32 lower triangle of ones from diagonal k
// on (0: j ≤ i; -1: j < i), S being ones' axis 1.
func triangle(f *fn.Func, ones fn.Value, k int64) fn.Value {
	row := f.Op("Slice", []fn.Value{ones, f.Ints(0), f.Ints(1), f.Ints(0)}) // [1,S]
	square := f.MatMul(f.Transpose(row, 1, 0), row)                         // [S,S]
	return f.Op("Trilu", []fn.Value{square, f.Int(k)}, fn.AttrInt("upper", 0))
}

// heads splits the conv output into q, k [B,VHeads,S,KDim] (L2-normed, q
// scaled by KDim^-0.5, key heads repeated onto their value heads, padding
// keys zero) and v [B,VHeads,S,VDim], all float32.
func (g GatedDeltaNet) heads(f *fn.Func, mixed, valid fn.Value) (q, k, v fn.Value) {
	kd, vd := int64(g.KHeads*g.KDim), int64(g.VHeads*g.VDim)
	parts := f.Split(f.CastTo(mixed, f.DType(), fn.Float32), 2, kd, kd, vd)
	q = f.Mul(g.keyHeads(f.Scope("q"), parts[0]), f.ScalarOf(fn.Float32, float32(math.Pow(float64(g.KDim), -0.5))))
	k = f.Mul(g.keyHeads(f.Scope("k"), parts[1]), f.Unsqueeze(valid, 1, 3))
	v = f.Transpose(f.Reshape(parts[2], 0, 0, int64(g.VHeads), int64(g.VDim)), 0, 2, 1, 3)
	return q, k, v
}

// keyHeads is x [B,S,KHeads·KDim] L2-normed per head (eps 1e-6 inside the
// root, as transformers' l2norm), each head repeated VHeads/KHeads times
// in place (repeat_interleave): [B,VHeads,S,KDim].
func (g GatedDeltaNet) keyHeads(f *fn.Func, x fn.Value) fn.Value {
	h := f.Reshape(x, 0, 0, int64(g.KHeads), int64(g.KDim))
	norm := f.Op("Sqrt", []fn.Value{f.Add(f.ReduceSum(f.Mul(h, h), true, -1), f.ScalarOf(fn.Float32, 1e-6))})
	h = f.Div(h, norm)
	if r := g.VHeads / g.KHeads; r > 1 {
		u := f.Unsqueeze(h, 3)
		copies := make([]fn.Value, r)
		for i := range copies {
			copies[i] = u
		}
		h = f.Reshape(f.Concat(3, copies...), 0, 0, int64(g.VHeads), int64(g.KDim))
	}
	return f.Transpose(h, 0, 2, 1, 3)
}

// decay is the log gate g = -exp(A_log)·softplus(a + dt_bias) [B,S,VHeads]
// in float32, 0 (no decay) at padding.
func (g GatedDeltaNet) decay(f *fn.Func, a, valid fn.Value) fn.Value {
	dt := f.DType()
	soft := f.Op("Softplus", []fn.Value{f.Add(f.CastTo(a, dt, fn.Float32), f.CastTo(g.DtBias, dt, fn.Float32))})
	rate := f.Op("Exp", []fn.Value{f.CastTo(g.ALog, dt, fn.Float32)})
	return f.Mul(f.Neg(f.Mul(rate, soft)), f.Unsqueeze(valid, -1))
}

// deltaRule runs the gated delta rule over the call from state s0
// [B,VHeads,KDim,VDim]: q, k [B,VHeads,S,KDim], v [B,VHeads,S,VDim], beta
// and the log gates [B,VHeads,S], all float32. It returns the outputs
// [B,VHeads,S,VDim] and the state after the last token.
func (g GatedDeltaNet) deltaRule(f *fn.Func, q, k, v, beta, gate, s0 fn.Value) (out, state fn.Value) {
	ones := f.OnesLike(f.ReduceSum(beta, false, 1), fn.Float32) // [B,S]
	lower, strict := triangle(f, ones, 0), triangle(f, ones, -1)
	cum := f.MatMul(lower, f.Unsqueeze(gate, -1))                                                          // [B,H,S,1]: G_i = Σ_{j≤i} g_j
	decay := f.Mul(f.Op("Exp", []fn.Value{f.Mul(f.Sub(cum, f.Transpose(cum, 0, 1, 3, 2)), lower)}), lower) // exp(G_i - G_j), j ≤ i
	kT := f.Transpose(k, 0, 1, 3, 2)
	b := f.Unsqueeze(beta, -1)
	kBeta := f.Mul(k, b)
	n := f.Neg(f.Mul(f.Mul(f.MatMul(kBeta, kT), decay), strict)) // -A, strictly lower

	// (I + A)⁻¹ [v·β, k·β·exp(G)] by the doubling product
	rhs := f.Concat(3, f.Mul(v, b), f.Mul(kBeta, f.Op("Exp", []fn.Value{cum})))
	power := n
	for i := 0; (1 << i) < g.MaxSeqLen; i++ {
		s := f.Scope(fmt.Sprintf("inverse%d", i))
		rhs = s.Add(rhs, s.MatMul(power, rhs))
		if (2 << i) < g.MaxSeqLen {
			power = s.MatMul(power, power)
		}
	}
	parts := f.Split(rhs, 3, int64(g.VDim), int64(g.KDim))
	vNew := f.Sub(parts[0], f.MatMul(parts[1], s0)) // [B,H,S,VDim]

	qDecay := f.Mul(q, f.Op("Exp", []fn.Value{cum}))
	out = f.Add(f.MatMul(qDecay, s0), f.MatMul(f.Mul(f.MatMul(q, kT), decay), vNew))
	out = f.Add(out, tooLong(f, beta, g.MaxSeqLen))

	last := f.Unsqueeze(f.ReduceSum(gate, true, 2), -1) // [B,H,1,1]: G at the end (0 gates at padding)
	kLate := f.Mul(k, f.Op("Exp", []fn.Value{f.Sub(last, cum)}))
	state = f.Add(f.Mul(s0, f.Op("Exp", []fn.Value{last})), f.MatMul(f.Transpose(kLate, 0, 1, 3, 2), vNew))
	return out, state
}

// tooLong is NaN when the call (axis 2 of x) is longer than max, else 0:
// the parallel form would not be exact.
func tooLong(f *fn.Func, x fn.Value, max int) fn.Value {
	over := f.Greater(f.Dim(x, 2), f.Int(int64(max)))
	return f.Where(over, f.ScalarOf(fn.Float32, float32(math.NaN())), f.ScalarOf(fn.Float32, 0))
}

// gatedNorm is transformers' RMSNormGated per value head: the core output
// [B,H,S,VDim] normed (in the compute dtype, weighed by w), times
// SiLU(z) in float32; [B,S,H·VDim].
func (g GatedDeltaNet) gatedNorm(f *fn.Func, core, z fn.Value) fn.Value {
	dt := f.DType()
	y := f.CastTo(f.Transpose(core, 0, 2, 1, 3), fn.Float32, dt) // [B,S,H,VDim]
	y = f.CastTo(RMSNorm(f, y, g.Norm, g.NormEps), dt, fn.Float32)
	zh := f.CastTo(f.Reshape(z, 0, 0, int64(g.VHeads), int64(g.VDim)), dt, fn.Float32)
	y = f.Mul(y, SiLU(f, zh))
	return f.Reshape(f.CastTo(y, fn.Float32, dt), 0, 0, int64(g.VHeads*g.VDim))
}
