package blocks

import (
	"math"

	"github.com/strata-llm/strata/sdk/fn"
)

// maskedScore is what masked attention scores become before the softmax: the
// lowest float16, so a fully masked (padding) row stays finite, also after a
// compiler converts the graph to float16.
const maskedScore = -65504

// Context-level blocks: computed once per model from position_ids and the
// shape of one KV cache input, then passed to every layer. The Qualcomm
// compiler rejects Range with a non-constant limit inside functions, which
// is why none of this lives in a layer.

// CacheSlots is 0..C-1 shaped [1,1,C]: the cache rows attention reads. C is
// the context length (axis 2) of a KV cache input, or, with compute-context-
// length, the length of the comp_ctx_lengths input (pass "" without CCL).
func CacheSlots(f *fn.Func, cache, compCtxLengths fn.Value) fn.Value {
	length := f.Dim(cache, 2)
	if compCtxLengths != "" {
		length = f.Dim(compCtxLengths, 0)
	}
	return f.Reshape(f.Range(f.Int(0), length, f.Int(1)), 1, 1, -1)
}

// CausalMask is [B,1,S,C] bool, true where cache slot j is later than the
// query's position (so padding queries, at -1, see nothing).
func CausalMask(f *fn.Func, positionIDs, slots fn.Value) fn.Value {
	masked := f.Greater(slots, f.Unsqueeze(positionIDs, -1)) // [B,S,C]
	return f.Unsqueeze(masked, 1)
}

// SlidingWindowMask is CausalMask restricted to the window keys before
// each query, itself included: slot j is masked for the query at position
// p when j > p or j ≤ p - window (transformers' sliding_window: a query
// sees the last window keys).
func SlidingWindowMask(f *fn.Func, positionIDs, slots fn.Value, window int) fn.Value {
	pos := f.Unsqueeze(positionIDs, -1) // [B,S,1]
	late := f.Greater(slots, pos)
	inWindow := f.Greater(slots, f.Sub(pos, f.Int(int64(window))))
	return f.Unsqueeze(f.Op("Or", []fn.Value{late, f.Op("Not", []fn.Value{inWindow})}), 1)
}

// CacheReadIndices are the cache rows each batch row reads, [B,1,C] int64,
// and which of them lie past the row's last position, [B,1,C,1] bool. Rows
// past it read slot 0 (never out of range) and their values are zeroed.
func CacheReadIndices(f *fn.Func, positionIDs, slots fn.Value) (indices, invalid fn.Value) {
	last := f.Unsqueeze(f.ReduceMax(positionIDs, true, 1), -1) // [B,1,1]
	beyond := f.Greater(slots, last)                           // [B,1,C]
	return f.Where(beyond, f.Int(0), slots), f.Unsqueeze(beyond, -1)
}

// AttentionContext is what a layer's attention takes from the model level.
type AttentionContext struct {
	PositionIDs          fn.Value // [B,S] int64
	BatchIndex           fn.Value // [B,1] int64 cache rows (continuous batching), or ""
	PastKey, PastValue   fn.Value // [B,nKV,C,hd]
	Cos, Sin             fn.Value // [B,1,S,rotary dim]
	Mask                 fn.Value // [B,1,S,C] bool, true = masked
	ReadIndices, Invalid fn.Value // see CacheReadIndices
	// ORT holds, for ONNX Runtime's form, what GroupQueryAttention reads
	// instead of the above but PastKey and PastValue; its SeqlensK set
	// selects that form (Attention.Apply).
	ORT ORTContext
}

// Attention is grouped-query self-attention over the retained KV cache.
type Attention struct {
	Heads, KVHeads, HeadDim int
	Scaling                 float64 // multiplies q·k; 1/√head_dim when 0
	RoPE                    RoPE
	Q, K, V, O              Linear
	// QNorm, KNorm: per-head RMSNorm weights [head_dim] applied to queries
	// and keys before RoPE (Qwen3), or "".
	QNorm, KNorm fn.Value
	NormEps      float64
	// NormAllHeads makes QNorm and KNorm one RMSNorm over all heads of the
	// projection's output, before it is split into heads: weights
	// [Heads*HeadDim] and [KVHeads*HeadDim] (OLMo-2).
	NormAllHeads bool
	// NormOnePlus makes QNorm and KNorm Gemma's RMSNorm (RMSNormOnePlus).
	NormOnePlus bool
	// Sinks: a learned logit per query head [Heads] that joins each row's
	// softmax and is then dropped (gpt-oss), or "".
	Sinks fn.Value
	// SoftCap, when not 0, caps the scaled scores before the mask:
	// SoftCap·tanh(scores/SoftCap), in the compute dtype (transformers'
	// Gemma-2 eager attention, attn_logit_softcapping).
	SoftCap float64
	// LocalWindow, when not 0, is a sliding window of that many keys
	// (transformers' sliding_window) in ONNX Runtime's form, where
	// GroupQueryAttention masks it (local_window_size).
	LocalWindow int
	// Gate, when its weight is set, gates the heads' output before O:
	// ctx·sigmoid(Gate(x)) (Qwen3-Next, Qwen3.5).
	Gate Linear
}

// Apply computes attention for x [B,S,H] (already normed), writing this
// step's keys and values into the cache. It returns the output [B,S,H] and
// the updated caches.
func (a Attention) Apply(f *fn.Func, x fn.Value, c AttentionContext) (out, presentKey, presentValue fn.Value) {
	if c.ORT.SeqlensK != "" {
		return a.applyGQA(f, x, c)
	}
	q := a.heads(f.Scope("q_proj"), a.Q, x, a.Heads, a.QNorm)
	k := a.heads(f.Scope("k_proj"), a.K, x, a.KVHeads, a.KNorm)
	v := a.heads(f.Scope("v_proj"), a.V, x, a.KVHeads, "")
	q = a.RoPE.Apply(f.Scope("rope_q"), q, c.Cos, c.Sin, a.HeadDim)
	k = a.RoPE.Apply(f.Scope("rope_k"), k, c.Cos, c.Sin, a.HeadDim)

	presentKey, presentValue = c.write(f, c.PastKey, k), c.write(f, c.PastValue, v)
	length := f.Dim(c.ReadIndices, 2) // ctx_len, or the compute-context-length
	keys, values := c.read(f, presentKey, length), c.read(f, presentValue, length)
	values = f.Where(c.Invalid, f.Scalar(0), values)

	ctx := a.core(f.Scope("core"), q, keys, values, c.Mask)
	if a.Gate.Weight != "" {
		ctx = f.Mul(ctx, f.Sigmoid(a.Gate.Apply(f.Scope("gate"), x)))
	}
	return a.O.Apply(f.Scope("o_proj"), ctx), presentKey, presentValue
}

// write scatters this step's keys or values into the cache.
func (c AttentionContext) write(f *fn.Func, cache, updates fn.Value) fn.Value {
	if c.BatchIndex != "" {
		return f.Call(CtxScatterCBFunc(), []fn.Value{cache, c.BatchIndex, c.PositionIDs, updates})
	}
	return f.Call(CtxScatterFunc(), []fn.Value{cache, c.PositionIDs, updates})
}

// read gathers the length cache rows the context selected.
func (c AttentionContext) read(f *fn.Func, cache, length fn.Value) fn.Value {
	if c.BatchIndex != "" {
		return f.Call(CtxGatherCBFunc(), []fn.Value{cache, c.BatchIndex, c.ReadIndices, length})
	}
	return f.Call(CtxGatherFunc(), []fn.Value{cache, c.ReadIndices, length})
}

// heads projects x [B,S,H] to [B,n,S,hd], norming each head if norm is set
// (or all heads together, before the split, with NormAllHeads).
func (a Attention) heads(f *fn.Func, l Linear, x fn.Value, n int, norm fn.Value) fn.Value {
	y := l.Apply(f, x)
	if norm != "" && a.NormAllHeads {
		y = Norm{Eps: a.NormEps, OnePlus: a.NormOnePlus}.Apply(f.Scope("norm"), y, norm)
	}
	y = f.Reshape(y, 0, 0, int64(n), int64(a.HeadDim))
	if norm != "" && !a.NormAllHeads {
		y = Norm{Eps: a.NormEps, OnePlus: a.NormOnePlus}.Apply(f.Scope("norm"), y, norm)
	}
	return f.Transpose(y, 0, 2, 1, 3)
}

// SoftCap is limit·tanh(x/limit) in x's dtype (Gemma-2's logit
// soft-capping: divided, not multiplied by 1/limit, as transformers computes
// it), or x unchanged when limit is 0.
func SoftCap(f *fn.Func, x fn.Value, limit float64) fn.Value {
	if limit == 0 {
		return x
	}
	c := f.Scalar(float32(limit))
	return f.Mul(f.Op("Tanh", []fn.Value{f.Div(x, c)}), c)
}

// core is softmax(q·kᵀ·scale + mask)·v (the scaled scores soft-capped first
// when SoftCap is set) with query heads grouped onto their
// KV head by a reshape (query head h reads KV head h / (Heads/KVHeads)), so
// no Expand with a dynamic shape is needed. The softmax runs in float32.
func (a Attention) core(f *fn.Func, q, keys, values, mask fn.Value) fn.Value {
	groups := int64(a.Heads / a.KVHeads)
	kv, hd := int64(a.KVHeads), int64(a.HeadDim)
	q5 := f.Reshape(q, 0, kv, groups, -1, hd)                         // [B,nKV,g,S,hd]
	k5 := f.Transpose(f.Unsqueeze(keys, 2), 0, 1, 2, 4, 3)            // [B,nKV,1,hd,C]
	scores := f.Mul(f.MatMul(q5, k5), f.Scalar(float32(a.scaling()))) // [B,nKV,g,S,C]
	scores = SoftCap(f, scores, a.SoftCap)
	scores = f.CastTo(scores, f.DType(), fn.Float32)
	scores = f.Where(f.Unsqueeze(mask, 1), f.ScalarOf(fn.Float32, maskedScore), scores)
	probs := f.CastTo(a.softmax(f, scores), fn.Float32, f.DType())
	ctx := f.MatMul(probs, f.Unsqueeze(values, 2))  // [B,nKV,g,S,hd]
	ctx = f.Reshape(ctx, 0, int64(a.Heads), -1, hd) // [B,nH,S,hd]
	ctx = f.Transpose(ctx, 0, 2, 1, 3)              // [B,S,nH,hd]
	return f.Reshape(ctx, 0, 0, int64(a.Heads)*hd)
}

// softmax normalises float32 scores [B,nKV,g,S,C] over the keys, with the
// sink logit (when set) in the denominator: exp(l_j - m) / (Σ exp(l_j - m) +
// exp(s - m)), m the row's maximum including s. Written with broadcasting,
// not a concatenated column, so no Expand of a dynamic shape is needed
// inside a layer function.
func (a Attention) softmax(f *fn.Func, scores fn.Value) fn.Value {
	if a.Sinks == "" {
		return f.Softmax(scores, -1)
	}
	kv, groups := int64(a.KVHeads), int64(a.Heads/a.KVHeads)
	sinks := f.Reshape(f.CastTo(a.Sinks, f.DType(), fn.Float32), 1, kv, groups, 1, 1)
	top := f.Op("Max", []fn.Value{f.ReduceMax(scores, true, -1), sinks})
	exp := f.Op("Exp", []fn.Value{f.Sub(scores, top)})
	total := f.Add(f.ReduceSum(exp, true, -1), f.Op("Exp", []fn.Value{f.Sub(sinks, top)}))
	return f.Div(exp, total)
}

func (a Attention) scaling() float64 {
	if a.Scaling != 0 {
		return a.Scaling
	}
	return math.Pow(float64(a.HeadDim), -0.5)
}
