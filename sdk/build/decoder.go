package build

import (
	"fmt"

	"github.com/strata-llm/strata/sdk"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// The parts every decoder-only LM of the Llama family shares: embedding,
// the context (RoPE tables, causal mask, cache read indices), a layer's
// standard inputs and outputs, and the final norm and head. A plugin then
// only writes its decoder layers.

// Names of the context values layers read, and of the KV cache.
const (
	CtxCos         = "cos"
	CtxSin         = "sin"
	CtxMask        = "mask"
	CtxReadIndices = "cache_read_indices"
	CtxReadInvalid = "cache_read_invalid"
	PastKey        = "past_key"
	PastValue      = "past_value"
)

// ContextOutputs are the context part's outputs, for the plan.
var ContextOutputs = []string{CtxCos, CtxSin, CtxMask, CtxReadIndices, CtxReadInvalid}

// KVCaches declares past_key and past_value [rows, kvHeads, ctx_len,
// headDim], rows being batch_size, or full_batch_size with continuous
// batching.
func KVCaches(opts *pb.ExportOptions, kvHeads, headDim int) []*pb.CacheSpec {
	rows := "batch_size"
	if opts.GetContinuousBatching() {
		rows = "full_batch_size"
	}
	shape := []*pb.Dim{DimParam(rows), DimSize(kvHeads), DimParam("ctx_len"), DimSize(headDim)}
	return []*pb.CacheSpec{{Name: PastKey, Shape: shape}, {Name: PastValue, Shape: shape}}
}

// Decoder describes a Llama-like model's non-layer parts. Its Build answers
// the embed, context and final parts and hands decoder layers to the plugin.
type Decoder struct {
	Domain string
	Name   string // functions are <Name>Embed, <Name>Context, <Name>Final
	// Checkpoint keys of the embedding, the final norm and the head (the
	// embedding again when tied).
	EmbedKey, NormKey, HeadKey string
	Eps                        float64 // the final norm's
	RoPE                       RoPE
}

// LayerBuilder builds the decoder layer function of one kind, computing in
// dt, with bindings for each of layers.
type LayerBuilder func(dt DType, kind string, layers []int32) (*pb.BuildResponse, error)

// Build answers a BuildRequest.
func (d Decoder) Build(req *pb.BuildRequest, layer LayerBuilder) (*pb.BuildResponse, error) {
	dt, err := ComputeDType(req.GetOptions())
	if err != nil {
		return nil, err
	}
	switch req.GetPart() {
	case sdk.PartEmbed:
		return EmbedPart(d.Domain, d.Name+"Embed", dt, d.EmbedKey), nil
	case sdk.PartContext:
		return ContextPart(d.Domain, d.Name+"Context", dt, d.RoPE, req.GetOptions()), nil
	case sdk.PartLayer:
		return layer(dt, req.GetKind(), req.GetLayers())
	case sdk.PartFinal:
		return FinalPart(d.Domain, d.Name+"Final", dt, d.Eps, d.NormKey, d.HeadKey), nil
	default:
		return nil, fmt.Errorf("%s has no part %q (parts: %s, %s, %s, %s)", d.Domain, req.GetPart(),
			sdk.PartEmbed, sdk.PartContext, sdk.PartLayer, sdk.PartFinal)
	}
}

// DecoderPlan plans layers 0..n-1, layer i of kind(i), every kind with the
// same caches.
func DecoderPlan(modelType string, n int, kind func(i int) string, caches []*pb.CacheSpec, vocab, hidden int) *pb.PlanResponse {
	plan := &pb.PlanResponse{ModelType: modelType, ContextOutputs: ContextOutputs,
		VocabSize: int64(vocab), HiddenSize: int64(hidden)}
	kinds := map[string]bool{}
	for i := range n {
		k := kind(i)
		if !kinds[k] {
			kinds[k] = true
			plan.Kinds = append(plan.Kinds, &pb.LayerKind{Name: k, Caches: caches})
		}
		plan.Layers = append(plan.Layers, &pb.Layer{Index: int32(i), Kind: k})
	}
	return plan
}

// EmbedPart looks input_ids up in the embedding tensor embedKey.
func EmbedPart(domain, name string, dt DType, embedKey string) *pb.BuildResponse {
	f := NewFunc(domain, name, dt)
	ids, table := f.Input(sdk.InputIDs), f.Input("embed_tokens.weight")
	f.Output(sdk.HiddenStates, Embedding(f, table, ids))
	return Response(f, Bind(sdk.NonLayer, "embed_tokens.weight", embedKey))
}

// ContextPart computes, once per model, the RoPE tables, the causal mask
// and the cache read indices every layer takes.
func ContextPart(domain, name string, dt DType, rope RoPE, opts *pb.ExportOptions) *pb.BuildResponse {
	f := NewFunc(domain, name, dt)
	pos, cache := f.Input(sdk.PositionIDs), f.Input(PastKey)
	var ccl Value
	if opts.GetCcl() {
		ccl = f.Input(sdk.CompCtxLengths)
	}
	cos, sin := rope.Tables(f.Scope("rope"), pos)
	slots := CacheSlots(f.Scope("cache"), cache, ccl)
	indices, invalid := CacheReadIndices(f.Scope("cache"), pos, slots)
	f.Output(CtxCos, cos)
	f.Output(CtxSin, sin)
	f.Output(CtxMask, CausalMask(f.Scope("mask"), pos, slots))
	f.Output(CtxReadIndices, indices)
	f.Output(CtxReadInvalid, invalid)
	return Response(f)
}

// LayerInputs declares a decoder layer's standard formal inputs (hidden
// state, positions, batch_index with continuous batching, the KV cache, the
// context values) and returns the hidden state and attention context.
func LayerInputs(f *Func, opts *pb.ExportOptions) (hidden Value, c AttentionContext) {
	hidden = f.Input(sdk.HiddenStates)
	c.PositionIDs = f.Input(sdk.PositionIDs)
	if opts.GetContinuousBatching() {
		c.BatchIndex = f.Input(sdk.BatchIndex)
	}
	c.PastKey, c.PastValue = f.Input(PastKey), f.Input(PastValue)
	c.Cos, c.Sin, c.Mask = f.Input(CtxCos), f.Input(CtxSin), f.Input(CtxMask)
	c.ReadIndices, c.Invalid = f.Input(CtxReadIndices), f.Input(CtxReadInvalid)
	return hidden, c
}

// LayerOutputs declares a decoder layer's outputs: the hidden state and the
// updated KV cache.
func LayerOutputs(f *Func, hidden, key, value Value) {
	f.Output(sdk.HiddenStatesOut, hidden)
	f.Output(PastKey+sdk.RetainedSuffix, key)
	f.Output(PastValue+sdk.RetainedSuffix, value)
}

// FinalPart picks each row's last valid token, norms it, and projects it to
// float32 logits with the head tensor headKey.
func FinalPart(domain, name string, dt DType, eps float64, normKey, headKey string) *pb.BuildResponse {
	f := NewFunc(domain, name, dt)
	hidden, pos := f.Input(sdk.HiddenStates), f.Input(sdk.PositionIDs)
	norm, head := f.Input("norm.weight"), f.Input("lm_head.weight")
	last := LastValidToken(f, hidden, pos)
	logits := Linear{Weight: head}.Apply(f.Scope("lm_head"), RMSNorm(f.Scope("norm"), last, norm, eps))
	f.Output(sdk.Logits, f.CastTo(logits, dt, Float32))
	return Response(f, Bind(sdk.NonLayer, "norm.weight", normKey, "lm_head.weight", headKey))
}

// LayerKey is the checkpoint key of a decoder layer's tensor:
// model.layers.<layer>.<name>.
func LayerKey(layer int32, name string) string {
	return fmt.Sprintf("model.layers.%d.%s", layer, name)
}
