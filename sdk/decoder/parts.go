package decoder

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/dtype"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// The non-layer parts every decoder-only LM shares: embedding, the context
// (RoPE tables, masks, cache read indices, computed once per model), and
// the final norm and head.

// Names of the standard context values layers read, and of the KV cache.
const (
	CtxCos         = "cos"
	CtxSin         = "sin"
	CtxMask        = "mask"
	CtxReadIndices = "cache_read_indices"
	CtxReadInvalid = "cache_read_invalid"
	PastKey        = "past_key"
	PastValue      = "past_value"
)

// StandardContext are the context values every decoder has, in order.
var StandardContext = []string{CtxCos, CtxSin, CtxMask, CtxReadIndices, CtxReadInvalid}

// KVCaches declares past_key and past_value [rows, kvHeads, ctx_len,
// headDim], rows being batch_size, or full_batch_size with continuous
// batching.
func KVCaches(opts *pb.ExportOptions, kvHeads, headDim int) []*pb.CacheSpec {
	rows := "batch_size"
	if opts.GetContinuousBatching() {
		rows = "full_batch_size"
	}
	length := "ctx_len"
	if opts.GetTarget() == sdk.TargetORT { // genai's past_key_values.{i}.*: what the past holds
		length = "past_sequence_length"
	}
	shape := []*pb.Dim{DimParam(rows), DimSize(kvHeads), DimParam(length), DimSize(headDim)}
	return []*pb.CacheSpec{{Name: PastKey, Shape: shape}, {Name: PastValue, Shape: shape}}
}

// Context is what a context value is computed from: position_ids [B,S],
// the cache slots attention reads [1,1,C], and the model's RoPE.
type Context struct {
	*fn.Func
	PositionIDs, Slots fn.Value
	RoPE               blocks.RoPE

	inputs map[string]fn.Value    // graph inputs declared so far, shared by the context values
	ropes  map[string][2]fn.Value // tables of the RoPEs the model added (AddRoPE), computed once
}

// Input declares name as a formal input of the context part, once however
// many context values read it (input_ids, one of Model.ExtraInputs).
func (c *Context) Input(name string) fn.Value {
	if v, ok := c.inputs[name]; ok {
		return v
	}
	c.inputs[name] = c.Func.Input(name)
	return c.inputs[name]
}

// ContextValue is a value the context part computes for the layers, e.g. a
// sliding-window mask beside the causal one.
type ContextValue struct {
	Name    string
	Compute func(c *Context) fn.Value
	// Window, when not 0, says the value is SlidingWindow's mask of that
	// many keys: ONNX Runtime's form (--target ort) gives the window to
	// GroupQueryAttention (local_window_size) instead of computing it.
	Window int
}

// SlidingWindow is a context value name's sliding-window mask: a query
// sees itself and the window-1 keys before it.
func SlidingWindow(name string, window int) ContextValue {
	return ContextValue{Name: name, Window: window, Compute: func(c *Context) fn.Value {
		return blocks.SlidingWindowMask(c.Func, c.PositionIDs, c.Slots, window)
	}}
}

// SlidingMask is the context value name of EverySliding's mask.
const SlidingMask = "sliding_mask"

// EverySliding masks every layer of m to the last window positions (Mistral,
// Phi-3): it refuses a window below 1, says what the cache keeps, and
// returns the mask's context value name for Attention.Mask.
func EverySliding(m *Model, window int) (string, error) {
	if window < 1 {
		return "", fmt.Errorf("config.json: sliding_window must be positive (or null for full attention), got %d", window)
	}
	m.Note("every layer keeps a ctx_len KV cache masked to the last %d positions (sliding_window)", window)
	m.AddContext(SlidingWindow(SlidingMask, window))
	return SlidingMask, nil
}

// ropeCos and ropeSin name the context values of the tables of a RoPE the
// model added with AddRoPE.
func ropeCos(name string) string { return name + "_cos" }
func ropeSin(name string) string { return name + "_sin" }

// ropeTables are the context values cos and sin [B,1,S,Dim] of rope
// (Tables from the sequence positions), computed once for both.
func ropeTables(name string, rope blocks.RoPE) []ContextValue {
	tables := func(c *Context) [2]fn.Value {
		t, ok := c.ropes[name]
		if !ok {
			cos, sin := rope.Tables(c.Func, c.PositionIDs)
			t = [2]fn.Value{cos, sin}
			c.ropes[name] = t
		}
		return t
	}
	return []ContextValue{
		{Name: ropeCos(name), Compute: func(c *Context) fn.Value { return tables(c)[0] }},
		{Name: ropeSin(name), Compute: func(c *Context) fn.Value { return tables(c)[1] }},
	}
}

// EmbedPart looks input_ids up in the embedding tensor.
func EmbedPart(domain, name string, dt fn.DType, embed weight.Expr) *pb.BuildResponse {
	return embedPart(domain, name, dt, embed, nil, dt, 0)
}

// embedPart is EmbedPart finished by hook (Model.Embed) when set. The table
// is looked up in dtype table, and the rows cast to dt when it differs,
// then multiplied by scale (Model.EmbedScale) in dt unless it is 0.
func embedPart(domain, name string, dt fn.DType, embed weight.Expr, hook func(f *fn.Func, ids, embedded fn.Value) fn.Value, table fn.DType, scale float64) *pb.BuildResponse {
	f := fn.NewFunc(domain, name, dt)
	ids, weights := f.Input(sdk.InputIDs), f.Input("embed_tokens.weight")
	hidden := blocks.Embedding(f, weights, ids)
	bind := weight.Bind("embed_tokens.weight", embed)
	if table != dt {
		hidden = f.Cast(hidden, dt)
		bind.Dtype = dtype.Name(table)
	}
	if scale != 0 {
		hidden = f.Mul(hidden, f.Scalar(float32(scale)))
	}
	if hook != nil {
		hidden = hook(f, ids, hidden)
	}
	f.Output(sdk.HiddenStates, hidden)
	return Response(f, &pb.LayerWeights{Layer: sdk.NonLayer, Bindings: []*pb.WeightBinding{bind}})
}

// embedTableDType is the dtype to look the embedding table up in: as
// stored when that is bfloat16 or float16, the compute dtype float32 and
// the table not the head's too. ONNX Runtime folds a Cast of a weight into
// a float32 copy at every session creation (262 MB for a 32000×2048 table);
// cast after the Gather, only the rows looked up are converted and the
// table stays as stored. Tied, the head needs the float32 copy anyway, and
// the two would both be held.
func (m *Model) embedTableDType(dt fn.DType) fn.DType {
	t, ok := m.Inventory[m.Key("embed_tokens.weight")]
	if !ok || m.Tied || dt != fn.Float32 {
		return dt
	}
	if stored, ok := dtype.FromSafetensors(t.GetDtype()); ok && (stored.Name == "bfloat16" || stored.Name == "float16") {
		return stored.ONNX
	}
	return dt
}

// ContextPart computes, once per model, the RoPE tables, the causal mask,
// the cache read indices, and the plugin's own context values.
func ContextPart(domain, name string, dt fn.DType, rope blocks.RoPE, opts *pb.ExportOptions, extra []ContextValue) *pb.BuildResponse {
	return contextPart(domain, name, dt, rope, opts, extra, positions{rank: 2}, PastKey)
}

// contextPart is ContextPart for position_ids of the given layout: with rank
// 3 ([3,B,S] rows), the RoPE tables come from all rows (RoPE.Tables3), or
// from rows 1..3 of 4 (RoPE.Tables4), and everything else, including the
// CtxPositions output, from row 0. The cache slots are axis 2 of the cache
// slotsCache (Model.SlotsCache).
func contextPart(domain, name string, dt fn.DType, rope blocks.RoPE, opts *pb.ExportOptions, extra []ContextValue, layout positions, slotsCache string) *pb.BuildResponse {
	rank := layout.rank
	f := fn.NewFunc(domain, name, dt)
	pos, cache := f.Input(sdk.PositionIDs), f.Input(slotsCache)
	var ccl fn.Value
	if opts.GetCcl() {
		ccl = f.Input(sdk.CompCtxLengths)
	}
	var cos, sin fn.Value
	switch {
	case rank == 3 && layout.rows == 4:
		cos, sin = rope.Tables4(f.Scope("rope"), pos)
		pos = TextPositions(f.Scope("positions"), pos)
	case rank == 3:
		cos, sin = rope.Tables3(f.Scope("rope"), pos)
		pos = TextPositions(f.Scope("positions"), pos)
	default:
		cos, sin = rope.Tables(f.Scope("rope"), pos)
	}
	slots := blocks.CacheSlots(f.Scope("cache"), cache, ccl)
	indices, invalid := blocks.CacheReadIndices(f.Scope("cache"), pos, slots)
	f.Output(CtxCos, cos)
	f.Output(CtxSin, sin)
	f.Output(CtxMask, blocks.CausalMask(f.Scope("mask"), pos, slots))
	f.Output(CtxReadIndices, indices)
	f.Output(CtxReadInvalid, invalid)
	if rank == 3 {
		f.Output(CtxPositions, pos)
	}
	declared, ropes := map[string]fn.Value{}, map[string][2]fn.Value{}
	for _, v := range extra {
		f.Output(v.Name, v.Compute(&Context{Func: f.Scope(v.Name), PositionIDs: pos, Slots: slots, RoPE: rope, inputs: declared, ropes: ropes}))
	}
	return Response(f)
}

// layerInputs declares a decoder layer's standard formal inputs (hidden
// state, positions, batch_index with continuous batching, the caches of the
// kind, and, for a kind with the KV cache, the standard context values) and
// returns the hidden state, the attention context and the caches other than
// the KV cache by name. A kind without past_key (linear attention) reads no
// context value, with position_ids of rank 3 too (it picks row 0 itself): a
// window of such layers needs no context part. A kind holding the model's
// slots cache other than past_key (MLA's k_pe) has its caches as states and
// reads the context values too.
func layerInputs(f *fn.Func, opts *pb.ExportOptions, rank int, caches []*pb.CacheSpec, slotsCache string) (hidden fn.Value, c blocks.AttentionContext, states map[string]fn.Value) {
	hidden = f.Input(sdk.HiddenStates)
	kv := hasCache(caches, PastKey)
	attends := kv || hasCache(caches, slotsCache)
	switch {
	case rank == 3 && attends: // the cache is written at row 0's positions, which the context part gives
		c.PositionIDs = f.Input(CtxPositions)
	case rank == 3: // no KV cache, no context value: row 0 picked here, so a window of such layers needs no context part
		c.PositionIDs = TextPositions(f.Scope("positions"), f.Input(sdk.PositionIDs))
	default:
		c.PositionIDs = f.Input(sdk.PositionIDs)
	}
	if opts.GetContinuousBatching() {
		c.BatchIndex = f.Input(sdk.BatchIndex)
	}
	if kv {
		c.PastKey, c.PastValue = f.Input(PastKey), f.Input(PastValue)
	} else {
		states = map[string]fn.Value{}
		for _, cs := range caches {
			states[cs.GetName()] = f.Input(cs.GetName())
		}
	}
	if !attends {
		return hidden, c, states
	}
	c.Cos, c.Sin, c.Mask = f.Input(CtxCos), f.Input(CtxSin), f.Input(CtxMask)
	c.ReadIndices, c.Invalid = f.Input(CtxReadIndices), f.Input(CtxReadInvalid)
	return hidden, c, states
}

// hasCache reports whether caches holds one called name.
func hasCache(caches []*pb.CacheSpec, name string) bool {
	return slices.ContainsFunc(caches, func(c *pb.CacheSpec) bool { return c.GetName() == name })
}

// finalHidden is the final part's formal output for OutputHidden.
const finalHidden = "hidden_states_normed"

// FinalPart picks each row's last valid token, norms it, and projects it
// to float32 logits. With allHidden it norms every position and also
// returns them as hidden_states (the norm is per token, so the logits are
// the same).
func FinalPart(domain, name string, dt fn.DType, eps float64, norm, head weight.Expr, allHidden bool) *pb.BuildResponse {
	return finalPart(domain, name, dt, blocks.Norm{Eps: eps}, 0, norm, head, allHidden, 2)
}

// finalPart is FinalPart for position_ids of the given rank (with 3, the
// last valid token is row 0's), its norm of kind kind; the logits are
// soft-capped in dt, before the cast to float32, when softCap is not 0
// (Model.FinalSoftCap).
func finalPart(domain, name string, dt fn.DType, kind blocks.Norm, softCap float64, norm, head weight.Expr, allHidden bool, rank int) *pb.BuildResponse {
	f := fn.NewFunc(domain, name, dt)
	hidden, pos := f.Input(sdk.HiddenStates), f.Input(sdk.PositionIDs)
	if rank == 3 {
		pos = TextPositions(f.Scope("positions"), pos)
	}
	normW, headW := f.Input("norm.weight"), f.Input("lm_head.weight")
	logits := func(normed fn.Value) fn.Value {
		l := blocks.Linear{Weight: headW}.Apply(f.Scope("lm_head"), normed)
		return f.CastTo(blocks.SoftCap(f.Scope("softcap"), l, softCap), dt, fn.Float32)
	}
	if allHidden {
		all := kind.Apply(f.Scope("norm"), hidden, normW)
		f.Output(sdk.Logits, logits(blocks.LastValidToken(f, all, pos)))
		f.Output(finalHidden, all)
	} else {
		f.Output(sdk.Logits, logits(kind.Apply(f.Scope("norm"), blocks.LastValidToken(f, hidden, pos), normW)))
	}
	return Response(f, &pb.LayerWeights{Layer: sdk.NonLayer, Bindings: []*pb.WeightBinding{
		weight.Bind("norm.weight", norm), weight.Bind("lm_head.weight", head)}})
}
