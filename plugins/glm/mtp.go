package main

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// MTP conventions (MTPLayout.convention).
const (
	// mtpInlined: model.layers.{N} for N in [num_hidden_layers,
	// num_hidden_layers + num_nextn_predict_layers) — the GLM-4.x releases.
	mtpInlined = "inlined"
	// mtpIndexed: top-level mtp.* keys listed in the index.
	mtpIndexed = "indexed"
	// mtpSeparateFile: the inlined layer's keys in a standalone
	// mtp.safetensors the index does not name (some GLM-4.7 repacks); the
	// host marks such tensors unindexed.
	mtpSeparateFile = "separate-file"
)

// mtpInfo is what Load found of the MTP layers, and whether the draft is
// asked for.
type mtpInfo struct {
	layout *pb.MTPLayout
	draft  bool
}

// detectMTP finds the MTP layers the config declares (num_nextn_predict_layers;
// null is 0) and those the checkpoint holds. With --mtp skip, declared but
// absent or present but undeclared layers are notes (transformers itself
// saves num_nextn_predict_layers 1 without any MTP weight); with draft
// they are errors.
func detectMTP(m *decoder.Model) (mtpInfo, error) {
	n := m.IntOr("num_nextn_predict_layers", 0)
	if m.Err != nil {
		return mtpInfo{}, m.Err
	}
	if n < 0 {
		return mtpInfo{}, fmt.Errorf("config.json: num_nextn_predict_layers must be ≥ 0, got %d", n)
	}
	info := mtpInfo{draft: m.Options[optMTP] == mtpDraft}
	first := m.Layers
	// The layers the checkpoint holds bound the work, never n (a count in
	// config.json: 1e9 would loop a billion times).
	var present, undeclared []int
	for _, i := range m.Inventory.LayerIndices(m.Prefix + "layers.") {
		switch {
		case i < first || !m.Inventory.HasPrefix(m.LayerKey(int32(i), "")):
		case i-first < n:
			present = append(present, i)
		default:
			undeclared = append(undeclared, i)
		}
	}
	var indexed []string
	for k := range m.Inventory {
		if strings.HasPrefix(k, "mtp.") {
			indexed = append(indexed, k)
		}
	}
	slices.Sort(indexed)
	span := func(ls []int) string {
		var s []string
		for _, i := range ls {
			s = append(s, m.LayerKey(int32(i), "")+"*")
		}
		return strings.Join(s, ", ")
	}
	missing := func() string { return missingSpan(m, first, n, present) }
	switch {
	case len(present) > 0 && len(present) < n:
		return info, fmt.Errorf("config.json: num_nextn_predict_layers is %d (MTP layers %d..%d), but the checkpoint holds %s and not %s: set it to the MTP layers the checkpoint holds",
			n, first, lastMTP(first, n), span(present), missing())
	case len(undeclared) > 0 && info.draft:
		return info, fmt.Errorf("the checkpoint holds %s past the %d decoder layers and the %d MTP layers config.json declares (num_nextn_predict_layers); cannot tell which layer the draft is",
			span(undeclared), first, n)
	case len(undeclared) > 0:
		m.Note("the checkpoint holds %s, which config.json declares neither as decoder nor as MTP layers; they are left out of the export", span(undeclared))
	}
	if len(present) > 0 {
		info.layout = &pb.MTPLayout{Convention: mtpInlined}
		for _, i := range present {
			info.layout.Layers = append(info.layout.Layers, int32(i))
		}
		for k := range m.Inventory {
			for _, i := range present {
				if strings.HasPrefix(k, m.LayerKey(int32(i), "")) {
					info.layout.Keys = append(info.layout.Keys, k)
				}
			}
		}
		slices.Sort(info.layout.Keys)
		if m.Inventory[info.layout.Keys[0]].GetUnindexed() { // a file the index does not name
			info.layout.Convention = mtpSeparateFile
		}
	} else if len(indexed) > 0 {
		info.layout = &pb.MTPLayout{Convention: mtpIndexed, Keys: indexed}
	}
	switch {
	case info.layout == nil && n > 0 && info.draft:
		return info, fmt.Errorf("--mtp draft: config.json declares %d MTP layer(s) (num_nextn_predict_layers) at %s, but the checkpoint holds none of their tensors "+
			"(nor mtp.* keys, nor a standalone mtp.safetensors holding them)",
			n, missing())
	case info.layout == nil && info.draft:
		return info, fmt.Errorf("--mtp draft: the checkpoint has no MTP layer (num_nextn_predict_layers is %d)", n)
	case info.layout == nil && n > 0:
		m.Note("config.json declares %d MTP layer(s) (num_nextn_predict_layers), but the checkpoint holds none of %s; exporting without them",
			n, missing())
	case info.layout.GetConvention() == mtpIndexed && info.draft:
		return info, fmt.Errorf("--mtp draft: the MTP weights are top-level mtp.* keys (%s, ...); the glm plugin builds the draft from inlined model.layers.{N} only", indexed[0])
	case info.layout != nil && !info.draft:
		m.Note("MTP layer(s) %s (%s, %d tensors) are left out of the export (--mtp draft exports them as mtp.onnx)",
			layerList(info.layout.GetLayers()), info.layout.GetConvention(), len(info.layout.GetKeys()))
	}
	return info, nil
}

// missingSpan names the declared MTP layers first..first+n-1 the checkpoint
// does not hold: each of a few, else how many and their range.
func missingSpan(m *decoder.Model, first, n int, present []int) string {
	const few = 8
	if n-len(present) > few {
		return fmt.Sprintf("%d of the layers %s* to %s*", n-len(present), m.LayerKey(int32(first), ""), m.LayerKey(int32(lastMTP(first, n)), ""))
	}
	var s []string
	for i := first; i-first < n; i++ {
		if !slices.Contains(present, i) {
			s = append(s, m.LayerKey(int32(i), "")+"*")
		}
	}
	return strings.Join(s, ", ")
}

// lastMTP is the last declared MTP layer, as a layer index can be.
func lastMTP(first, n int) int {
	return first + min(n, math.MaxInt32-first) - 1
}

func layerList(ls []int32) string {
	if len(ls) == 0 {
		return "mtp.*"
	}
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = fmt.Sprint(l)
	}
	return strings.Join(s, ", ")
}

// declare records the layout in the plan and, with --mtp draft, makes the
// main model also return its final hidden states and declares mtp.onnx.
func (info mtpInfo) declare(m *decoder.Model, c config) error {
	m.MTP = info.layout
	if !info.draft && info.layout.GetConvention() == mtpInlined {
		d := &draft{m: m, layer: info.layout.GetLayers()[0]}
		m.AddModel(d.spec(), func(*fn.Func) (*pb.BuildResponse, error) {
			return nil, fmt.Errorf("mtp.onnx needs --mtp draft (plugin option mtp=draft), which also makes model.onnx output the hidden_states the draft reads")
		})
	}
	if !info.draft {
		return nil
	}
	layer := info.layout.GetLayers()[0]
	if len(info.layout.GetLayers()) > 1 {
		m.Note("mtp.onnx is the first MTP layer (%d) of %d", layer, len(info.layout.GetLayers()))
	}
	d := &draft{m: m, layer: layer, kind: c.kind(int(layer))}
	if err := d.check(); err != nil {
		return err
	}
	m.OutputHidden = true
	spec := d.spec()
	spec.ByDefault = true // --mtp draft asks for mtp.onnx
	m.AddModel(spec, d.build)
	return nil
}

// draft is the MTP layer as a speculative-decoding draft, wired as vLLM's
// Glm4MoeMultiTokenPredictorLayer runs it:
//
//	e = embed(input_ids), zeroed where position_ids == 0
//	x = eh_proj(concat[enorm(e), hnorm(hidden_states)])
//	y = decoder layer N (its own KV cache past_key.N / past_value.N)
//	logits = shared_head.head(shared_head.norm(y)) at the last valid token
//
// input_ids are the tokens one step ahead of hidden_states (the main
// model's final-norm output). embed_tokens and shared_head.head are the MTP
// layer's own when the checkpoint has them, else the main model's.
type draft struct {
	m     *decoder.Model
	layer int32
	kind  string
}

func (d *draft) key(name string) string { return d.m.LayerKey(d.layer, name) }

func (d *draft) embedWeight() weight.Expr {
	m := d.m
	key := m.Key("embed_tokens.weight")
	if m.Inventory.Has(d.key("embed_tokens.weight")) {
		key = d.key("embed_tokens.weight")
	}
	return weight.Tensor(key, int64(m.Vocab), int64(m.Hidden))
}

func (d *draft) headWeight() weight.Expr {
	m := d.m
	key := "lm_head.weight"
	switch {
	case m.Inventory.Has(d.key("shared_head.head.weight")):
		key = d.key("shared_head.head.weight")
	case m.Tied:
		key = m.Key("embed_tokens.weight")
	case m.HeadKey != "":
		key = m.HeadKey
	}
	return weight.Tensor(key, int64(m.Vocab), int64(m.Hidden))
}

// own are the draft's weights outside the decoder layer.
func (d *draft) own() []decoder.NamedWeight {
	h := int64(d.m.Hidden)
	return []decoder.NamedWeight{
		{Input: "embed_tokens.weight", Expr: d.embedWeight()},
		{Input: "enorm.weight", Expr: weight.Tensor(d.key("enorm.weight"), h)},
		{Input: "hnorm.weight", Expr: weight.Tensor(d.key("hnorm.weight"), h)},
		{Input: "eh_proj.weight", Expr: weight.Tensor(d.key("eh_proj.weight"), h, 2*h)},
		{Input: "shared_head.norm.weight", Expr: weight.Tensor(d.key("shared_head.norm.weight"), h)},
		{Input: "shared_head.head.weight", Expr: d.headWeight()},
	}
}

// check: every tensor the draft binds is present with its shape.
func (d *draft) check() error {
	_, ws, err := d.m.KindFunction("strata.check", fn.Float32, d.kind, d.layer)
	if err != nil {
		return fmt.Errorf("MTP layer %d: %w", d.layer, err)
	}
	var want []sdk.ExpectedTensor
	for _, w := range append(d.own(), ws...) {
		want = append(want, w.Expr.Leaves()...)
	}
	if err := d.m.Inventory.ExpectAll(want); err != nil {
		return fmt.Errorf("--mtp draft: MTP layer %d: %w", d.layer, err)
	}
	return nil
}

func (d *draft) cacheName(base string) string { return fmt.Sprintf("%s.%d", base, d.layer) }

func (d *draft) spec() *pb.ModelSpec {
	m := d.m
	tokens := []*pb.Dim{decoder.DimParam("batch_size"), decoder.DimParam("seq_len")}
	caches := decoder.KVCaches(m.Export, m.KVHeads, m.HeadDim)
	s := &pb.ModelSpec{Name: modelMTP,
		Help: "the MTP layer as a speculative-decoding draft: input_ids one step ahead of hidden_states (model.onnx's final-norm output)",
		Inputs: []*pb.IOSpec{{Name: sdk.InputIDs, Dtype: "int64", Shape: tokens}, {Name: sdk.PositionIDs, Dtype: "int64", Shape: tokens},
			{Name: sdk.HiddenStates, Dtype: "compute", Shape: append(slices.Clone(tokens), decoder.DimSize(m.Hidden))}},
		Outputs: []*pb.IOSpec{{Name: sdk.Logits, Dtype: "float32",
			Shape: []*pb.Dim{decoder.DimParam("batch_size"), decoder.DimSize(1), decoder.DimSize(m.Vocab)}}},
	}
	if m.Export.GetContinuousBatching() {
		s.Inputs = append(s.Inputs, &pb.IOSpec{Name: sdk.BatchIndex, Dtype: "int64", Shape: []*pb.Dim{decoder.DimParam("batch_size"), decoder.DimSize(1)}})
	}
	for _, c := range caches {
		s.Inputs = append(s.Inputs, &pb.IOSpec{Name: d.cacheName(c.GetName()), Dtype: "compute", Shape: c.GetShape()})
		s.Outputs = append(s.Outputs, &pb.IOSpec{Name: d.cacheName(c.GetName()) + sdk.RetainedSuffix, Dtype: "compute", Shape: c.GetShape()})
	}
	if m.Export.GetCcl() {
		s.Inputs = append(s.Inputs, &pb.IOSpec{Name: sdk.CompCtxLengths, Dtype: "int64", Shape: []*pb.Dim{decoder.DimParam("comp_ctx_lengths")}})
	}
	return s
}

func (d *draft) build(f *fn.Func) (*pb.BuildResponse, error) {
	m := d.m
	proto := f.Proto()
	layerFn, layerWeights, err := m.KindFunction(proto.GetDomain(), f.DType(), d.kind, d.layer)
	if err != nil {
		return nil, err
	}
	ids, pos, hidden := f.Input(sdk.InputIDs), f.Input(sdk.PositionIDs), f.Input(sdk.HiddenStates)
	var batchIndex, ccl fn.Value
	if m.Export.GetContinuousBatching() {
		batchIndex = f.Input(sdk.BatchIndex)
	}
	pastKey, pastValue := f.Input(d.cacheName(decoder.PastKey)), f.Input(d.cacheName(decoder.PastValue))
	if m.Export.GetCcl() {
		ccl = f.Input(sdk.CompCtxLengths)
	}
	w := map[string]fn.Value{}
	for _, nw := range d.own() {
		w[nw.Input] = f.Input(nw.Input)
	}

	emb := blocks.Embedding(f, w["embed_tokens.weight"], ids)
	first := f.Unsqueeze(f.Op("Equal", []fn.Value{pos, f.Int(0)}), -1) // [B,S,1]
	emb = f.Where(first, f.ScalarOf(f.DType(), 0), emb)
	e := blocks.RMSNorm(f.Scope("enorm"), emb, w["enorm.weight"], m.Eps)
	h := blocks.RMSNorm(f.Scope("hnorm"), hidden, w["hnorm.weight"], m.Eps)
	x := blocks.Linear{Weight: w["eh_proj.weight"]}.Apply(f.Scope("eh_proj"), f.Concat(-1, e, h))

	ctx := f.Scope("context")
	cos, sin := m.RoPE.Tables(ctx.Scope("rope"), pos)
	slots := blocks.CacheSlots(ctx.Scope("cache"), pastKey, ccl)
	indices, invalid := blocks.CacheReadIndices(ctx.Scope("cache"), pos, slots)
	mask := blocks.CausalMask(ctx.Scope("mask"), pos, slots)
	standard := map[string]fn.Value{sdk.HiddenStates: x, sdk.PositionIDs: pos, sdk.BatchIndex: batchIndex,
		decoder.PastKey: pastKey, decoder.PastValue: pastValue, decoder.CtxCos: cos, decoder.CtxSin: sin, decoder.CtxMask: mask,
		decoder.CtxReadIndices: indices, decoder.CtxReadInvalid: invalid}
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
			return nil, fmt.Errorf("MTP layer %d: the layer function's input %q is neither a standard input nor a weight", d.layer, in)
		}
	}
	f.Use(lp)
	for _, dep := range layerFn.Dependencies() {
		f.Use(dep)
	}
	outs := f.Scope("mtp_block").OpN(lp.GetName(), lp.GetDomain(), 1+len(lp.GetOutput()[1:]), args)

	last := blocks.LastValidToken(f, outs[0], pos)
	normed := blocks.RMSNorm(f.Scope("shared_head/norm"), last, w["shared_head.norm.weight"], m.Eps)
	logits := blocks.Linear{Weight: w["shared_head.head.weight"]}.Apply(f.Scope("shared_head/head"), normed)
	f.Output(sdk.Logits, f.CastTo(logits, f.DType(), fn.Float32))
	f.Output(d.cacheName(decoder.PastKey)+sdk.RetainedSuffix, outs[1])
	f.Output(d.cacheName(decoder.PastValue)+sdk.RetainedSuffix, outs[2])

	lw := &pb.LayerWeights{Layer: sdk.NonLayer}
	for _, nw := range append(d.own(), layerWeights...) {
		lw.Bindings = append(lw.Bindings, weight.Bind(nw.Input, nw.Expr))
	}
	return decoder.Response(f, lw), nil
}
