package decoder

import (
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// The caches of multi-head latent attention, named as QEfficient names them:
// the normed latent and the rotated shared key, not per-head keys and
// values.
const (
	CompressedKV = "compressed_kv"
	KPE          = "k_pe"
)

// MLACaches declares compressed_kv [rows, ctx_len, rank] and k_pe [rows,
// 1, ctx_len, ropeDim], rows being batch_size, or full_batch_size with
// continuous batching. k_pe's axis 2 is ctx_len: set Model.SlotsCache to
// KPE.
func MLACaches(opts *pb.ExportOptions, rank, ropeDim int) []*pb.CacheSpec {
	rows := "batch_size"
	if opts.GetContinuousBatching() {
		rows = "full_batch_size"
	}
	return []*pb.CacheSpec{
		{Name: CompressedKV, Shape: []*pb.Dim{DimParam(rows), DimParam("ctx_len"), DimSize(rank)}},
		{Name: KPE, Shape: []*pb.Dim{DimParam(rows), DimSize(1), DimParam("ctx_len"), DimSize(ropeDim)}},
	}
}

// MLA is DeepSeek-V3's attention as a Mixer, its weights named as
// transformers names them (self_attn.q_a_proj, q_a_layernorm, q_b_proj or
// q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj).
type MLA struct {
	QLoRARank                    int // 0: q_proj, no q LoRA
	Rank, NopeDim, RopeDim, VDim int
	Bias                         bool // attention_bias: q_a_proj, kv_a_proj_with_mqa, o_proj
	Scaling                      float64
	Interleave                   bool
	Form                         string // blocks.MLAAbsorbed or blocks.MLAExpanded
	block                        blocks.MLA
}

// Declare declares the projections and norms in transformers' order.
func (a *MLA) Declare(l *Layer) {
	m := l.Model
	h, qk := m.Hidden, m.Heads*(a.NopeDim+a.RopeDim)
	b := blocks.MLA{Heads: m.Heads, Rank: a.Rank, NopeDim: a.NopeDim, RopeDim: a.RopeDim, VDim: a.VDim,
		Scaling: a.Scaling, RoPE: m.RoPE, Interleave: a.Interleave, Form: a.Form, NormEps: m.Eps}
	if a.QLoRARank > 0 {
		b.QA = l.Linear("self_attn.q_a_proj", a.QLoRARank, h, a.Bias)
		b.QANorm = l.Weight("self_attn.q_a_layernorm.weight", int64(a.QLoRARank))
		b.QB = l.Linear("self_attn.q_b_proj", qk, a.QLoRARank, false)
	} else {
		b.Q = l.Linear("self_attn.q_proj", qk, h, false)
	}
	b.KVA = l.Linear("self_attn.kv_a_proj_with_mqa", a.Rank+a.RopeDim, h, a.Bias)
	b.KVANorm = l.Weight("self_attn.kv_a_layernorm.weight", int64(a.Rank))
	b.KVB = l.Linear("self_attn.kv_b_proj", m.Heads*(a.NopeDim+a.VDim), a.Rank, false)
	b.O = l.Linear("self_attn.o_proj", h, m.Heads*a.VDim, a.Bias)
	b.CompressedKV, b.KPE = l.States[CompressedKV], l.States[KPE]
	a.block = b
}

// Mix computes the attention and the retained compressed_kv and k_pe.
func (a *MLA) Mix(l *Layer, f *fn.Func, x fn.Value) (fn.Value, []fn.Value) {
	out, ckv, kpe := a.block.Apply(f, x, l.Attn)
	return out, []fn.Value{ckv, kpe}
}

// Scope is self_attn.
func (a *MLA) Scope() string { return "self_attn" }
