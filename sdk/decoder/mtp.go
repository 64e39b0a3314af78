package decoder

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// The plugin option choosing what becomes of multi-token-prediction (MTP)
// layers, and the separate model --mtp draft writes (mtp.onnx).
const (
	MTPOptionName = "mtp"
	MTPSkip       = "skip"
	MTPDraft      = "draft"
	ModelMTP      = "mtp"
)

// MTPOption is the plugin option "mtp": skip (default) or draft.
func MTPOption() *pb.PluginOption {
	return &pb.PluginOption{Name: MTPOptionName, DefaultValue: MTPSkip, AllowedValues: []string{MTPSkip, MTPDraft},
		Help: "skip: MTP weights stay out of the graphs; draft: also write the MTP layer as the draft model mtp.onnx, and model.onnx also outputs the hidden_states it reads"}
}

// StoreLayer makes layer i's keys prefix + name (LayerKey): a layer stored
// apart from model.layers, e.g. an MTP layer under mtp.layers.0., given an
// index past the decoder layers so that KindFunction and StoredExperts bind
// it like any layer.
func (m *Model) StoreLayer(i int32, prefix string) {
	if m.storedAt == nil {
		m.storedAt = map[int32]string{}
	}
	m.storedAt[i] = prefix
}

// Draft is an MTP layer run as a speculative-decoding draft (mtp.onnx), as
// vLLM runs the DeepSeek-style MTP modules:
//
//	e = Embed(input_ids)            (zeroed where position_ids == 0 with ZeroFirst)
//	x = Proj(concat[EmbedNorm(e), HiddenNorm(hidden_states)])
//	y = decoder layer Layer of kind Kind (its own caches: past_key.{Layer}, or MLA's compressed_kv/k_pe)
//	logits = Head(FinalNorm(y)) at the last valid token
//
// input_ids are the tokens one step ahead of hidden_states (the main
// model's final-norm output, Model.OutputHidden). The norms are the model's
// (Model.NormOnePlus).
type Draft struct {
	Model *Model
	// Layer is the index the layer's weights are bound at (LayerKey;
	// StoreLayer for a layer stored apart); it names the draft's cache.
	Layer int32
	Kind  string
	// The weights outside the decoder layer; Input is the formal input's
	// name in mtp.onnx.
	Embed, EmbedNorm, HiddenNorm, Proj, FinalNorm, Head NamedWeight
	// ZeroFirst zeroes the embedding at position 0 (vLLM's GLM and
	// DeepSeek MTP do; Qwen3-Next's does not).
	ZeroFirst bool
}

// Declare records the draft in the plan. With asked (--mtp draft) the main
// model also returns its final hidden states and mtp.onnx is written by
// default, after every tensor it binds is checked; without, asking for
// mtp.onnx (--extra-model mtp) is refused with the option to set.
func (d *Draft) Declare(asked bool) error {
	if !asked {
		d.Model.AddModel(d.Spec(), func(*fn.Func) (*pb.BuildResponse, error) {
			return nil, fmt.Errorf("mtp.onnx needs --mtp draft (plugin option mtp=draft), which also makes model.onnx output the hidden_states the draft reads")
		})
		return nil
	}
	if err := d.Check(); err != nil {
		return err
	}
	d.Model.OutputHidden = true
	spec := d.Spec()
	spec.ByDefault = true // --mtp draft asks for mtp.onnx
	d.Model.AddModel(spec, d.Build)
	return nil
}

// own are the draft's weights outside the decoder layer.
func (d *Draft) own() []NamedWeight {
	return []NamedWeight{d.Embed, d.EmbedNorm, d.HiddenNorm, d.Proj, d.FinalNorm, d.Head}
}

// Check: every tensor the draft binds is present with its shape.
func (d *Draft) Check() error {
	_, ws, err := d.Model.KindFunction("strata.check", fn.Float32, d.Kind, d.Layer)
	if err != nil {
		return fmt.Errorf("MTP layer %d: %w", d.Layer, err)
	}
	var want []sdk.ExpectedTensor
	for _, w := range append(d.own(), ws...) {
		want = append(want, w.Expr.Leaves()...)
	}
	if err := d.Model.Inventory.ExpectAll(want); err != nil {
		return fmt.Errorf("--mtp draft: MTP layer %d: %w", d.Layer, err)
	}
	return nil
}

func (d *Draft) cacheName(base string) string { return fmt.Sprintf("%s.%d", base, d.Layer) }

// caches are the layer kind's caches (the KV cache, or MLA's).
func (d *Draft) caches() []*pb.CacheSpec {
	if k, ok := d.Model.kind(d.Kind); ok {
		return k.caches(d.Model)
	}
	return KVCaches(d.Model.Export, d.Model.KVHeads, d.Model.HeadDim)
}

// Spec is mtp.onnx's interface: input_ids, position_ids, hidden_states,
// batch_index with continuous batching, the layer kind's caches,
// comp_ctx_lengths with CCL; logits and the retained cache.
func (d *Draft) Spec() *pb.ModelSpec {
	m := d.Model
	tokens := []*pb.Dim{DimParam("batch_size"), DimParam("seq_len")}
	s := &pb.ModelSpec{Name: ModelMTP,
		Help: "the MTP layer as a speculative-decoding draft: input_ids one step ahead of hidden_states (model.onnx's final-norm output)",
		Inputs: []*pb.IOSpec{{Name: sdk.InputIDs, Dtype: "int64", Shape: tokens}, {Name: sdk.PositionIDs, Dtype: "int64", Shape: tokens},
			{Name: sdk.HiddenStates, Dtype: "compute", Shape: append(slices.Clone(tokens), DimSize(m.Hidden))}},
		Outputs: []*pb.IOSpec{{Name: sdk.Logits, Dtype: "float32", Shape: []*pb.Dim{DimParam("batch_size"), DimSize(1), DimSize(m.Vocab)}}},
	}
	if m.Export.GetContinuousBatching() {
		s.Inputs = append(s.Inputs, &pb.IOSpec{Name: sdk.BatchIndex, Dtype: "int64", Shape: []*pb.Dim{DimParam("batch_size"), DimSize(1)}})
	}
	for _, c := range d.caches() {
		s.Inputs = append(s.Inputs, &pb.IOSpec{Name: d.cacheName(c.GetName()), Dtype: "compute", Shape: c.GetShape()})
		s.Outputs = append(s.Outputs, &pb.IOSpec{Name: d.cacheName(c.GetName()) + sdk.RetainedSuffix, Dtype: "compute", Shape: c.GetShape()})
	}
	if m.Export.GetCcl() {
		s.Inputs = append(s.Inputs, &pb.IOSpec{Name: sdk.CompCtxLengths, Dtype: "int64", Shape: []*pb.Dim{DimParam("comp_ctx_lengths")}})
	}
	return s
}

// Build writes mtp.onnx's graph and its bindings.
func (d *Draft) Build(f *fn.Func) (*pb.BuildResponse, error) {
	m := d.Model
	proto := f.Proto()
	layerFn, layerWeights, err := m.KindFunction(proto.GetDomain(), f.DType(), d.Kind, d.Layer)
	if err != nil {
		return nil, err
	}
	pos := f.Input(sdk.PositionIDs)
	x := d.project(f, f.Input(sdk.InputIDs), pos, f.Input(sdk.HiddenStates))
	standard := d.layerContext(f, x, pos)
	bound := map[string]bool{}
	for _, nw := range layerWeights {
		bound[nw.Input] = true
	}
	lp := layerFn.Proto()
	var args []fn.Value
	for _, in := range lp.GetInput() {
		switch v, ok := standard[in]; {
		case ok && v != "":
			args = append(args, v)
		case bound[in]:
			args = append(args, f.Input(in))
		default:
			return nil, fmt.Errorf("MTP layer %d: the layer function's input %q is neither a standard input nor a weight", d.Layer, in)
		}
	}
	f.Use(lp)
	for _, dep := range layerFn.Dependencies() {
		f.Use(dep)
	}
	outs := f.Scope("mtp_block").OpN(lp.GetName(), lp.GetDomain(), len(lp.GetOutput()), args)

	last := blocks.LastValidToken(f, outs[0], pos)
	normed := m.norm().Apply(f.Scope("final_norm"), last, f.Input(d.FinalNorm.Input))
	logits := blocks.Linear{Weight: f.Input(d.Head.Input)}.Apply(f.Scope("head"), normed)
	f.Output(sdk.Logits, f.CastTo(logits, f.DType(), fn.Float32))
	for i, c := range d.caches() {
		f.Output(d.cacheName(c.GetName())+sdk.RetainedSuffix, outs[1+i])
	}

	lw := &pb.LayerWeights{Layer: sdk.NonLayer}
	for _, nw := range append(d.own(), layerWeights...) {
		lw.Bindings = append(lw.Bindings, weight.Bind(nw.Input, nw.Expr))
	}
	return Response(f, lw), nil
}

// project is the layer's input: Proj over the normed embedding and the
// normed hidden state, concatenated in that order.
func (d *Draft) project(f *fn.Func, ids, pos, hidden fn.Value) fn.Value {
	norm := d.Model.norm()
	emb := blocks.Embedding(f, f.Input(d.Embed.Input), ids)
	if d.ZeroFirst {
		first := f.Unsqueeze(f.Op("Equal", []fn.Value{pos, f.Int(0)}), -1) // [B,S,1]
		emb = f.Where(first, f.ScalarOf(f.DType(), 0), emb)
	}
	e := norm.Apply(f.Scope("embed_norm"), emb, f.Input(d.EmbedNorm.Input))
	h := norm.Apply(f.Scope("hidden_norm"), hidden, f.Input(d.HiddenNorm.Input))
	return blocks.Linear{Weight: f.Input(d.Proj.Input)}.Apply(f.Scope("proj"), f.Concat(-1, e, h))
}

// layerContext are the layer function's standard inputs: the projected
// hidden state, positions, the draft's own caches and what the context
// part computes for it (RoPE tables, mask, cache read indices), from the
// model's slots cache.
func (d *Draft) layerContext(f *fn.Func, x, pos fn.Value) map[string]fn.Value {
	m := d.Model
	var batchIndex, ccl fn.Value
	if m.Export.GetContinuousBatching() {
		batchIndex = f.Input(sdk.BatchIndex)
	}
	standard := map[string]fn.Value{sdk.HiddenStates: x, sdk.PositionIDs: pos, sdk.BatchIndex: batchIndex}
	for _, c := range d.caches() {
		standard[c.GetName()] = f.Input(d.cacheName(c.GetName()))
	}
	if m.Export.GetCcl() {
		ccl = f.Input(sdk.CompCtxLengths)
	}
	ctx := f.Scope("context")
	cos, sin := m.RoPE.Tables(ctx.Scope("rope"), pos)
	slots := blocks.CacheSlots(ctx.Scope("cache"), standard[m.slotsCache()], ccl)
	indices, invalid := blocks.CacheReadIndices(ctx.Scope("cache"), pos, slots)
	standard[CtxCos], standard[CtxSin] = cos, sin
	standard[CtxMask] = blocks.CausalMask(ctx.Scope("mask"), pos, slots)
	standard[CtxReadIndices], standard[CtxReadInvalid] = indices, invalid
	return standard
}
