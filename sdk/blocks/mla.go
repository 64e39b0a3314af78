package blocks

import (
	"math"

	"github.com/strata-llm/strata/sdk/fn"
)

// MLA forms: how attention reads the cached latent.
const (
	// MLAAbsorbed folds kv_b_proj's key half into the query and its value
	// half after the attention-weighted latent: scores and context are
	// computed on the kv_lora_rank latent itself, so a decode step reads
	// the cache once and never expands ctx_len rows to per-head keys and
	// values (DeepSeek-V2's "absorbed" inference form).
	MLAAbsorbed = "absorbed"
	// MLAExpanded projects the cached latent through kv_b_proj to per-head
	// keys and values at every call, as transformers computes it.
	MLAExpanded = "expanded"
)

// MLA is DeepSeek-V2/V3's multi-head latent attention over a cache of the
// normed latent (compressed_kv [rows, C, Rank]) and the rotated shared key
// (k_pe [rows, 1, C, RopeDim]), as QEfficient caches it.
type MLA struct {
	Heads                  int
	Rank                   int // kv_lora_rank
	NopeDim, RopeDim, VDim int // qk_nope_head_dim, qk_rope_head_dim, v_head_dim
	Scaling                float64
	RoPE                   RoPE
	Interleave             bool // rope_interleave: rotary channels stored as pairs
	Form                   string
	NormEps                float64
	QA, QB, Q              Linear // q_a_proj and q_b_proj with q_lora_rank, else q_proj
	QANorm                 fn.Value
	KVA                    Linear // kv_a_proj_with_mqa [Rank+RopeDim, hidden]
	KVANorm                fn.Value
	KVB                    Linear // kv_b_proj [Heads·(NopeDim+VDim), Rank], no bias
	O                      Linear
	CompressedKV, KPE      fn.Value // the past caches
}

// Apply computes attention for x [B,S,H] (already normed), writing this
// step's latent and rotary key into the caches; it returns the output and
// the updated caches.
func (a MLA) Apply(f *fn.Func, x fn.Value, c AttentionContext) (out, compressedKV, kPE fn.Value) {
	qk := int64(a.NopeDim + a.RopeDim)
	var q fn.Value
	if a.QA.Weight != "" {
		qa := a.QA.Apply(f.Scope("q_a_proj"), x)
		qa = Norm{Eps: a.NormEps}.Apply(f.Scope("q_a_layernorm"), qa, a.QANorm)
		q = a.QB.Apply(f.Scope("q_b_proj"), qa)
	} else {
		q = a.Q.Apply(f.Scope("q_proj"), x)
	}
	q = f.Transpose(f.Reshape(q, 0, 0, int64(a.Heads), qk), 0, 2, 1, 3) // [B,nH,S,qk]
	qParts := f.Split(q, -1, int64(a.NopeDim), int64(a.RopeDim))
	qNope, qRope := qParts[0], a.rotate(f.Scope("rope_q"), qParts[1], c)

	kv := f.Split(a.KVA.Apply(f.Scope("kv_a_proj_with_mqa"), x), -1, int64(a.Rank), int64(a.RopeDim))
	latent := Norm{Eps: a.NormEps}.Apply(f.Scope("kv_a_layernorm"), kv[0], a.KVANorm) // [B,S,R]
	kRope := a.rotate(f.Scope("rope_k"), f.Unsqueeze(kv[1], 1), c)                    // [B,1,S,rope]

	// compressed_kv is [rows, C, R]: the cache ops take [rows, heads, C, D].
	ckv4 := f.Unsqueeze(a.CompressedKV, 1)
	ckv4 = c.write(f, ckv4, f.Unsqueeze(latent, 1))
	compressedKV = f.Op("Squeeze", []fn.Value{ckv4, f.Ints(1)})
	kPE = c.write(f, a.KPE, kRope)

	length := f.Dim(c.ReadIndices, 2)
	// Rows past the last position are zeroed: 0 times a masked weight is 0,
	// whatever a never-written row holds.
	keysLatent := f.Where(c.Invalid, f.Scalar(0), c.read(f, ckv4, length)) // [B,1,L,R]
	keysRope := f.Where(c.Invalid, f.Scalar(0), c.read(f, kPE, length))    // [B,1,L,rope]

	ropeScores := f.MatMul(qRope, f.Transpose(keysRope, 0, 1, 3, 2)) // [B,nH,S,L]
	var ctx fn.Value
	if a.Form == MLAExpanded {
		ctx = a.expanded(f.Scope("expanded"), qNope, ropeScores, keysLatent, c.Mask)
	} else {
		ctx = a.absorbed(f.Scope("absorbed"), qNope, ropeScores, keysLatent, c.Mask)
	}
	ctx = f.Reshape(f.Transpose(ctx, 0, 2, 1, 3), 0, 0, int64(a.Heads*a.VDim)) // [B,S,nH·v]
	return a.O.Apply(f.Scope("o_proj"), ctx), compressedKV, kPE
}

// rotate turns x [B,n,S,rope] by the tables; interleaved channels
// (x0,x1,x2,x3,...) are first regrouped as (x0,x2,...,x1,x3,...), as
// transformers' apply_rotary_pos_emb_interleave does.
func (a MLA) rotate(f *fn.Func, x fn.Value, c AttentionContext) fn.Value {
	if a.Interleave {
		d := int64(a.RopeDim)
		x = f.Reshape(f.Transpose(f.Reshape(x, 0, 0, 0, d/2, 2), 0, 1, 2, 4, 3), 0, 0, 0, d)
	}
	return a.RoPE.Apply(f, x, c.Cos, c.Sin, a.RopeDim)
}

// kvB is kv_b_proj's weight per head: [nH, NopeDim+VDim, R].
func (a MLA) kvB(f *fn.Func) []fn.Value {
	w := f.Reshape(a.KVB.Weight, int64(a.Heads), int64(a.NopeDim+a.VDim), int64(a.Rank))
	return f.Split(w, 1, int64(a.NopeDim), int64(a.VDim)) // [nH,nope,R], [nH,v,R]
}

// absorbed: q_nope·W_ukᵀ is the query in latent space, so the scores and
// the attention-weighted sum run on the latent, and W_uv maps the result
// to each head's values.
func (a MLA) absorbed(f *fn.Func, qNope, ropeScores, latent, mask fn.Value) fn.Value {
	w := a.kvB(f)
	qLatent := f.MatMul(qNope, w[0])                                                // [B,nH,S,R]
	scores := f.Add(f.MatMul(qLatent, f.Transpose(latent, 0, 1, 3, 2)), ropeScores) // [B,nH,S,L]
	probs := a.softmax(f, scores, mask)
	ctxLatent := f.MatMul(probs, latent)                   // [B,nH,S,R]
	return f.MatMul(ctxLatent, f.Transpose(w[1], 0, 2, 1)) // [B,nH,S,v]
}

// expanded: keys and values of every read row from kv_b_proj.
func (a MLA) expanded(f *fn.Func, qNope, ropeScores, latent, mask fn.Value) fn.Value {
	kv := a.KVB.Apply(f.Scope("kv_b_proj"), f.Op("Squeeze", []fn.Value{latent, f.Ints(1)})) // [B,L,nH·(nope+v)]
	kv = f.Transpose(f.Reshape(kv, 0, 0, int64(a.Heads), int64(a.NopeDim+a.VDim)), 0, 2, 1, 3)
	parts := f.Split(kv, -1, int64(a.NopeDim), int64(a.VDim))
	scores := f.Add(f.MatMul(qNope, f.Transpose(parts[0], 0, 1, 3, 2)), ropeScores)
	return f.MatMul(a.softmax(f, scores, mask), parts[1])
}

// softmax scales, masks and normalises scores [B,nH,S,L] in float32.
func (a MLA) softmax(f *fn.Func, scores, mask fn.Value) fn.Value {
	scores = f.CastTo(f.Mul(scores, f.Scalar(float32(a.scaling()))), f.DType(), fn.Float32)
	scores = f.Where(mask, f.ScalarOf(fn.Float32, maskedScore), scores)
	return f.CastTo(f.Softmax(scores, -1), fn.Float32, f.DType())
}

func (a MLA) scaling() float64 {
	if a.Scaling != 0 {
		return a.Scaling
	}
	return math.Pow(float64(a.NopeDim+a.RopeDim), -0.5)
}
