package blocks

import (
	"fmt"
	"math"

	"github.com/strata-llm/strata/sdk/fn"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// ONNX Runtime's form of the decoder (--target ort): its contrib ops where
// the blocks map onto them, and onnxruntime-genai's decoder IO. The KV
// cache is past_key_values.{i}.key/value [B,nKV,past,hd] in, present.{i}.*
// out; GroupQueryAttention appends the new keys (or writes them in place
// when genai passes one buffer as past and present) and turns q and k by
// the RoPE itself.

// MSDomain is ONNX Runtime's contrib op domain.
const MSDomain = "com.microsoft"

// ORTContext is what GroupQueryAttention reads from the model level,
// computed once per model from attention_mask (ORTContextValues).
type ORTContext struct {
	SeqlensK    fn.Value // [B] int32: each row's tokens so far, minus 1
	TotalSeqLen fn.Value // int32 scalar: attention_mask's width
	Cos, Sin    fn.Value // [T, rotary dim/2] in the compute dtype
}

// ORTContextValues computes ORTContext from attention_mask [B,T] int64 as
// onnxruntime-genai's builder does (seqlens_k = Σmask - 1, the total the
// mask's width), and the RoPE caches in the graph: no baked table. When
// the frequencies do not depend on the length (every kind but longrope),
// the caches are of positions 0..contextLength-1 from constants alone, so
// ONNX Runtime folds them once at session creation rather than computing
// T rows at every step; longrope's switch to its long factors past
// original_max_position_embeddings keeps them of 0..T-1, per step.
func ORTContextValues(f *fn.Func, mask fn.Value, rope RoPE, contextLength int64) ORTContext {
	seqlens := f.Cast(f.Sub(f.ReduceSum(mask, false, 1), f.Int(1)), fn.Int32)
	width := f.Dim(mask, 1)
	rows := width
	if rope.LongInvFreq() == nil {
		rows = f.Int(contextLength)
	}
	cos, sin := rope.Caches(f.Scope("rope"), rows)
	return ORTContext{SeqlensK: seqlens, TotalSeqLen: f.Cast(width, fn.Int32), Cos: cos, Sin: sin}
}

// LastAttendedToken picks, per batch row, the hidden state of the last new
// token attention_mask marks 1 (mask [B,T] int64, hidden [B,S,H], the new
// tokens the mask's last S columns): [B,1,H]. onnxruntime-genai pads a
// batch on the right, where the last position of a shorter row is a pad;
// a row with none marked (all padding) gives its last position.
func LastAttendedToken(f *fn.Func, hidden, mask fn.Value) fn.Value {
	news := f.Op("Shape", []fn.Value{hidden}, fn.AttrInt("start", 1), fn.AttrInt("end", 2))  // [1]: S
	window := f.Op("Slice", []fn.Value{mask, f.Neg(news), f.Ints(math.MaxInt64), f.Ints(1)}) // [B,S]
	last := f.Op("ArgMax", []fn.Value{window}, fn.AttrInt("axis", 1), fn.AttrInt("keepdims", 1),
		fn.AttrInt("select_last_index", 1)) // [B,1]
	return f.Op("GatherND", []fn.Value{hidden, f.Unsqueeze(last, -1)}, fn.AttrInt("batch_dims", 1))
}

// ORTMoE runs softmax top-k routed SwiGLU experts as one com.microsoft MoE
// node: x [T,H] in the compute dtype, router logits [T,E] (the kernel
// takes their softmax in float32, then the top k, renormalised to sum 1
// when normalize), fc1 [E,2I,H] with each expert's gate and up rows
// interleaved (row 2j gate j, row 2j+1 up j: the CPU kernel's only SwiGLU
// layout), fc2 [E,H,I]. silu(gate)·up is the kernel's gate·σ(α·gate)·(up+β)
// at α 1, β 0; it reads only each token's experts, in place.
func ORTMoE(f *fn.Func, x, logits, fc1, fc2 fn.Value, topK int, normalize bool) fn.Value {
	f.Import(MSDomain, 1)
	norm := int64(0)
	if normalize {
		norm = 1
	}
	return f.OpN("MoE", MSDomain, 1, []fn.Value{x, logits, fc1, "", fc2},
		fn.AttrInt("k", int64(topK)), fn.AttrString("activation_type", "swiglu"), fn.AttrInt("swiglu_fusion", 1),
		fn.AttrFloat("activation_alpha", 1), fn.AttrFloat("activation_beta", 0), fn.AttrInt("normalize_routing_weights", norm))[0]
}

// Caches are GroupQueryAttention's cos_cache and sin_cache [length,
// Dim/2] for positions 0..length-1 (length an int64 scalar): the first
// half of Tables' (rotate_half's tables repeat their halves), scaled the
// same, in the compute dtype.
func (r RoPE) Caches(f *fn.Func, length fn.Value) (cos, sin fn.Value) {
	pos := f.Range(f.Int(0), length, f.Int(1))                                                  // [T]
	freqs := f.Mul(f.Unsqueeze(f.Cast(pos, fn.Float32), -1), r.invFreq(f, f.Unsqueeze(pos, 0))) // [T,Dim/2]
	cos, sin = f.Cos(freqs), f.Sin(freqs)
	if r.AttentionScaling != 1 {
		scale := f.ScalarOf(fn.Float32, float32(r.AttentionScaling))
		cos, sin = f.Mul(cos, scale), f.Mul(sin, scale)
	}
	return f.CastTo(cos, fn.Float32, f.DType()), f.CastTo(sin, fn.Float32, f.DType())
}

// SimplifiedRMSNorm is RMSNorm as ONNX Runtime's SimplifiedLayerNormalization
// (its fused kernel; ONNX domain in ONNX Runtime's registry), the mean of
// squares in float32 whatever x's dtype, as transformers' LlamaRMSNorm.
func SimplifiedRMSNorm(f *fn.Func, x, weight fn.Value, eps float64) fn.Value {
	return f.Op("SimplifiedLayerNormalization", []fn.Value{x, weight},
		fn.AttrInt("axis", -1), fn.AttrFloat("epsilon", float32(eps)), fn.AttrInt("stash_type", 1))
}

// SkipSimplifiedRMSNorm is x + skip and its RMSNorm by weight as one
// com.microsoft SkipSimplifiedLayerNormalization (outputs: the normed
// sum, mean and inv_std_var left out, the sum): a residual add and the next norm in
// one node, as onnxruntime-genai's builder emits them. x and skip are both
// [B,S,H]; the kernel's statistics are float32 as SimplifiedRMSNorm's.
func SkipSimplifiedRMSNorm(f *fn.Func, x, skip, weight fn.Value, eps float64) (normed, sum fn.Value) {
	f.Import(MSDomain, 1)
	outs := f.OpUsed("SkipSimplifiedLayerNormalization", MSDomain, []bool{true, false, false, true},
		[]fn.Value{x, skip, weight}, fn.AttrFloat("epsilon", float32(eps)))
	return outs[0], outs[3]
}

// Fused reports whether n's form fuses a residual add into the norm that
// follows it (SkipSimplifiedRMSNorm).
func (n Norm) Fused() bool { return n.ORT && !n.OnePlus }

// applyORT is x·Wᵀ + b as com.microsoft FusedMatMul(transB=1) on the
// weight as stored [out, in]: one node on x of any rank, its weight
// pre-packed at session creation as MatMul's is, with no transposed copy
// folded (MatMul of a Transpose) and none of Gemm's Flatten and Reshape
// around it. Measured (ONNX Runtime 1.32 CPU, one [2816, 1024] float32
// weight, CPU time per call on 1 thread, min of 9, two runs): decode (1
// token) FusedMatMul 448-450 µs, Transpose+MatMul 448-449, Gemm with its
// Flatten/Reshape 453-462; 128 tokens 4460-4570, 4480-4510, 4700-4720;
// session creation 61-62 ms, 76-77, 94-95.
func (l Linear) applyORT(f *fn.Func, x fn.Value) fn.Value {
	f.Import(MSDomain, 1)
	y := f.OpN("FusedMatMul", MSDomain, 1, []fn.Value{x, l.Weight}, fn.AttrInt("transB", 1))[0]
	if l.Bias != "" {
		y = f.Add(y, l.Bias)
	}
	return y
}

// ORTUnmapped says which of the attention's features GroupQueryAttention
// cannot express, or "" when it maps.
func (a Attention) ORTUnmapped() string {
	switch {
	case a.Sinks != "":
		return "attention sinks (self_attn.sinks)"
	case a.Gate.Weight != "":
		return "an output gate on attention"
	case a.NormOnePlus:
		return "q/k norms weighing by 1 + w (Gemma)"
	case a.RoPE.Dim <= 0 || a.RoPE.Dim%2 != 0:
		return fmt.Sprintf("a rotary dimension of %d", a.RoPE.Dim)
	case len(a.RoPE.MRoPESection) > 0:
		return "multimodal RoPE (position rows)"
	}
	return ""
}

// applyGQA is Apply as com.microsoft GroupQueryAttention: q, k, v stay
// [B,S,n·hd] (q/k norms applied per head or over all heads first, as
// transformers does before the RoPE); GQA turns them by the RoPE caches
// (do_rotary), appends k and v to the cache and attends causally to each
// row's seqlens_k + 1 tokens. The soft cap is GQA's softcap attribute.
// q, k and v stay three projections, where the builder packs one: packing
// them here would concatenate their weights, a copy ONNX Runtime makes at
// every session creation, to save 2 nodes a layer (about 0.1 ms of a 26 ms
// decode step, 178M Llama, ONNX Runtime 1.32's profiler). Scaling q ahead
// of GQA, so its Q·Kᵀ GEMM runs at alpha 1, measured no different.
func (a Attention) applyGQA(f *fn.Func, x fn.Value, c AttentionContext) (out, presentKey, presentValue fn.Value) {
	q := a.packed(f.Scope("q_proj"), a.Q, x, a.Heads, a.QNorm)
	k := a.packed(f.Scope("k_proj"), a.K, x, a.KVHeads, a.KNorm)
	v := a.V.Apply(f.Scope("v_proj"), x)
	o := c.ORT
	// ONNX Runtime 1.32's CPU kernel turns q and k itself only for a
	// head_size that is a multiple of 16 (real checkpoints' 64, 128); other
	// sizes are turned here, at the positions GQA would use.
	inside := a.HeadDim%16 == 0 && a.RoPE.Dim%16 == 0 // its cos_cache: a multiple of 8 wide
	cos, sin := o.Cos, o.Sin
	if !inside {
		q, k = a.ropeOutside(f.Scope("rope"), x, q, k, o)
		cos, sin = "", ""
	}
	attrs := []*onnxpb.AttributeProto{
		fn.AttrInt("num_heads", int64(a.Heads)), fn.AttrInt("kv_num_heads", int64(a.KVHeads)),
		fn.AttrFloat("scale", float32(a.scaling())), fn.AttrInt("do_rotary", boolAttr(inside)), fn.AttrInt("rotary_interleaved", 0),
	}
	if a.LocalWindow != 0 {
		attrs = append(attrs, fn.AttrInt("local_window_size", int64(a.LocalWindow)))
	}
	if a.SoftCap != 0 {
		attrs = append(attrs, fn.AttrFloat("softcap", float32(a.SoftCap)))
	}
	f.Import(MSDomain, 1)
	outs := f.OpN("GroupQueryAttention", MSDomain, 3,
		[]fn.Value{q, k, v, c.PastKey, c.PastValue, o.SeqlensK, o.TotalSeqLen, cos, sin}, attrs...)
	return a.O.Apply(f.Scope("o_proj"), outs[0]), outs[1], outs[2]
}

// packed projects x [B,S,H] to [B,S,n·hd], normed as heads() norms.
func (a Attention) packed(f *fn.Func, l Linear, x fn.Value, n int, norm fn.Value) fn.Value {
	y := l.Apply(f, x)
	switch {
	case norm == "":
		return y
	case a.NormAllHeads:
		return SimplifiedRMSNorm(f.Scope("norm"), y, norm, a.NormEps)
	}
	y = SimplifiedRMSNorm(f.Scope("norm"), f.Reshape(y, 0, 0, int64(n), int64(a.HeadDim)), norm, a.NormEps)
	return f.Reshape(y, 0, 0, int64(n*a.HeadDim))
}

// ropeOutside turns packed q and k [B,S,n·hd] by the RoPE caches at the
// positions GroupQueryAttention gives the new tokens: 0..S-1 for a first
// prompt (the total is S), else seqlens_k + 1 - S onwards for each row.
func (a Attention) ropeOutside(f *fn.Func, x, q, k fn.Value, o ORTContext) (fn.Value, fn.Value) {
	seq := f.Dim(x, 1)
	steps := f.Range(f.Int(0), seq, f.Int(1)) // [S]
	past := f.Sub(f.Add(f.Cast(o.SeqlensK, fn.Int64), f.Int(1)), seq)
	first := f.Op("Equal", []fn.Value{f.Cast(o.TotalSeqLen, fn.Int64), seq})
	pos := f.Add(f.Unsqueeze(f.Where(first, f.Int(0), past), -1), steps) // [B,S]
	table := func(cache fn.Value) fn.Value {
		half := f.Gather(cache, pos, 0) // [B,S,Dim/2]
		return f.Unsqueeze(f.Concat(-1, half, half), 2)
	}
	cos, sin := table(o.Cos), table(o.Sin) // [B,S,1,Dim]: heads broadcast
	turn := func(y fn.Value, n int) fn.Value {
		y = a.RoPE.Apply(f, f.Reshape(y, 0, 0, int64(n), int64(a.HeadDim)), cos, sin, a.HeadDim)
		return f.Reshape(y, 0, 0, int64(n*a.HeadDim))
	}
	return turn(q, a.Heads), turn(k, a.KVHeads)
}

func boolAttr(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
