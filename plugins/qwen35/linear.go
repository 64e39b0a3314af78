package qwen35

import (
	"fmt"
	"strconv"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// The linear-attention layers' caches, as QEfficient names them.
const (
	convState      = "conv_state"
	recurrentState = "recurrent_state"
)

// linearAttention is the gated DeltaNet of a model: its sizes and how its
// in-projections are stored.
type linearAttention struct {
	model *decoder.Model
	block blocks.GatedDeltaNet
	fused bool // in_proj_qkvz + in_proj_ba (Qwen3-Next)
}

// readLinear reads the linear_* fields.
func readLinear(m *decoder.Model, fam family) (*linearAttention, error) {
	la := &linearAttention{model: m, fused: fam.fusedInProj, block: blocks.GatedDeltaNet{
		KHeads: m.Int("linear_num_key_heads"), VHeads: m.Int("linear_num_value_heads"),
		KDim: m.Int("linear_key_head_dim"), VDim: m.Int("linear_value_head_dim"),
		Kernel: m.Int("linear_conv_kernel_dim"), NormEps: m.Eps,
	}}
	if m.Err != nil {
		return nil, m.Err
	}
	maxSeq, err := strconv.Atoi(m.Options[optMaxSeq])
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", optMaxSeq, m.Options[optMaxSeq], err)
	}
	la.block.MaxSeqLen = maxSeq
	if err := la.block.Check(); err != nil {
		return nil, fmt.Errorf("%s: %w", m.Config.Path(), err)
	}
	return la, nil
}

// caches are conv_state [rows, q+k+v channels, kernel] (the last kernel
// inputs of the conv, as transformers and QEfficient keep them) and
// recurrent_state [rows, value heads, key dim, value dim].
func (la *linearAttention) caches(m *decoder.Model) []*pb.CacheSpec {
	rows := decoder.DimParam("batch_size")
	if m.Export.GetContinuousBatching() {
		rows = decoder.DimParam("full_batch_size")
	}
	g := la.block
	return []*pb.CacheSpec{
		{Name: convState, Shape: []*pb.Dim{rows, decoder.DimSize(g.Channels()), decoder.DimSize(g.Kernel)}},
		{Name: recurrentState, Shape: []*pb.Dim{rows, decoder.DimSize(g.VHeads), decoder.DimSize(g.KDim), decoder.DimSize(g.VDim)}},
	}
}

// mixer is a fresh linear_attn mixer for one layer body.
func (la *linearAttention) mixer() decoder.Mixer { return &linearMixer{la: la, block: la.block} }

type linearMixer struct {
	la    *linearAttention
	block blocks.GatedDeltaNet
}

func (x *linearMixer) Scope() string { return "linear_attn" }

// Declare declares the projections (separate, or rows of Qwen3-Next's
// fused ones), the conv kernel, A_log, dt_bias, the gated norm and out_proj.
func (x *linearMixer) Declare(l *decoder.Layer) {
	g, h := &x.block, int64(l.Model.Hidden)
	vd := int64(g.VHeads * g.VDim)
	if x.la.fused {
		x.declareFused(l)
	} else {
		g.QKV = l.Linear("linear_attn.in_proj_qkv", g.Channels(), int(h), false)
		g.Z = l.Linear("linear_attn.in_proj_z", int(vd), int(h), false)
		g.B = l.Linear("linear_attn.in_proj_b", g.VHeads, int(h), false)
		g.A = l.Linear("linear_attn.in_proj_a", g.VHeads, int(h), false)
	}
	g.Conv = l.Weight("linear_attn.conv1d.weight", int64(g.Channels()), 1, int64(g.Kernel))
	g.ALog = l.Weight("linear_attn.A_log", int64(g.VHeads))
	g.DtBias = l.Weight("linear_attn.dt_bias", int64(g.VHeads))
	g.Norm = l.Weight("linear_attn.norm.weight", int64(g.VDim))
	g.Out = l.Linear("linear_attn.out_proj", int(h), int(vd), false)
}

// declareFused binds q, k, v, z from in_proj_qkvz [kHeads·(2·kDim +
// 2·r·vDim), hidden] (per key head: its q, k, then its r value heads' v,
// then their z) and b, a from in_proj_ba [kHeads·2r, hidden] (per key head:
// r b rows, r a rows), r = value heads per key head.
func (x *linearMixer) declareFused(l *decoder.Layer) {
	g, m := &x.block, l.Model
	nk, hk, hv, h := int64(g.KHeads), int64(g.KDim), int64(g.VDim), int64(m.Hidden)
	r := int64(g.VHeads / g.KHeads)
	per := 2*hk + 2*r*hv
	rows := func(i int32, key string, width, start, end int64) weight.Expr {
		stored := weight.Reshape(weight.Tensor(m.LayerKey(i, key), nk*width, h), nk, width, h)
		return weight.Reshape(weight.Slice(stored, 1, start, end, 1), nk*(end-start), h)
	}
	const qkvz, ba = "linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight"
	g.QKV.Weight = l.Computed("linear_attn.in_proj_qkv.weight", func(i int32) weight.Expr {
		return weight.Concat(0, rows(i, qkvz, per, 0, hk), rows(i, qkvz, per, hk, 2*hk), rows(i, qkvz, per, 2*hk, 2*hk+r*hv))
	})
	g.Z.Weight = l.Computed("linear_attn.in_proj_z.weight", func(i int32) weight.Expr { return rows(i, qkvz, per, 2*hk+r*hv, per) })
	g.B.Weight = l.Computed("linear_attn.in_proj_b.weight", func(i int32) weight.Expr { return rows(i, ba, 2*r, 0, r) })
	g.A.Weight = l.Computed("linear_attn.in_proj_a.weight", func(i int32) weight.Expr { return rows(i, ba, 2*r, r, 2*r) })
}

// Mix runs the block over the layer's states.
func (x *linearMixer) Mix(l *decoder.Layer, f *fn.Func, in fn.Value) (fn.Value, []fn.Value) {
	c := blocks.StateContext{PositionIDs: l.Attn.PositionIDs, BatchIndex: l.Attn.BatchIndex,
		Conv: l.States[convState], Recurrent: l.States[recurrentState]}
	out, conv, rec := x.block.Apply(f, in, c)
	return out, []fn.Value{conv, rec}
}
