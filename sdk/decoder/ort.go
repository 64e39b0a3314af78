package decoder

import (
	"fmt"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// The common decoder in ONNX Runtime's form (ExportOptions.target "ort"):
// the same parts and weights, the context computed from attention_mask
// (blocks.ORTContextValues), attention as com.microsoft
// GroupQueryAttention, RMSNorms as SimplifiedLayerNormalization, logits at
// every position or (ExportOptions.logits "last") each row's last token.
// A model maps when every layer is a residual of mappable blocks
// (Attention, SwiGLU, or a block implementing ORTBlock) over the KV cache
// alone; anything else is refused by Plan with what does not map.

// Context values of the ORT form, in plan order.
const (
	CtxSeqlensK    = "seqlens_k"
	CtxTotalSeqLen = "total_sequence_length"
	CtxCosCache    = "cos_cache"
	CtxSinCache    = "sin_cache"
)

// ORTContext are the context values of the ORT form, in order.
var ORTContext = []string{CtxSeqlensK, CtxTotalSeqLen, CtxCosCache, CtxSinCache}

// ORTBlock is a layer block (a Block or Mixer) that says whether it maps
// onto ONNX Runtime's form: ORTUnmapped returns what does not, or "".
// A block without it is refused by --target ort (MoE until it maps onto
// ORT's MoE op or the gather form).
type ORTBlock interface {
	ORTUnmapped(l *Layer) string
}

// ORT reports whether the export asks for ONNX Runtime's form.
func (m *Model) ORT() bool { return m.Export.GetTarget() == sdk.TargetORT }

// ortLastLogits reports whether the ORT form's logits are each row's last
// token's only (--logits last).
func (m *Model) ortLastLogits() bool { return m.Export.GetLogits() == sdk.LogitsLast }

// checkORT refuses a model that does not map onto the ORT form, naming
// what does not; it runs every kind's body once, so a block that does not
// map is found before anything is built.
func (m *Model) checkORT() error {
	refuse := func(what string) error {
		return fmt.Errorf("--target ort: %s does not map onto ONNX Runtime's decoder form: %s; export it without --target ort", m.arch.ModelType, what)
	}
	switch logits := m.Export.GetLogits(); {
	case logits != "" && logits != sdk.LogitsAll && logits != sdk.LogitsLast:
		return fmt.Errorf("logits %q: the ORT form's logits are %s (every position) or %s (each row's last token)", logits, sdk.LogitsAll, sdk.LogitsLast)
	case m.InputsEmbeds || m.Embed != nil || len(m.ExtraInputs) > 0:
		return refuse("the model takes inputs other than input_ids (vision or multimodal inputs)")
	case m.positionRank() == 3:
		return refuse("multimodal RoPE (position_ids rows)")
	case m.OutputHidden:
		return refuse("the model also outputs hidden states (an MTP draft)")
	case m.NormOnePlus:
		return refuse("RMSNorms weighing by 1 + w (Gemma)")
	case m.SlotsCache != "":
		return refuse(fmt.Sprintf("caches other than the KV cache (%s: latent attention)", m.SlotsCache))
	case len(m.ropes) > 0:
		return refuse("a second RoPE for some layers")
	}
	for _, v := range m.context {
		if v.Window == 0 {
			return refuse(fmt.Sprintf("a context value of its own (%s)", v.Name))
		}
	}
	for _, k := range m.kinds {
		switch {
		case k.Caches != nil:
			return refuse(fmt.Sprintf("layer kind %s has caches of its own (linear attention or latent attention), not past_key/past_value", k.Name))
		case k.Post != nil:
			return refuse(fmt.Sprintf("layer kind %s has a step after the layer (DeepStack)", k.Name))
		}
		if _, err := m.declare(k); err != nil {
			return err
		}
	}
	m.ortContextLength = int64(m.IntOr("max_position_embeddings", 4096))
	return m.Err
}

// contextWindow is the sliding window of the context value name, 0 if it
// is none.
func (m *Model) contextWindow(name string) int {
	for _, v := range m.context {
		if v.Name == name {
			return v.Window
		}
	}
	return 0
}

// ortUnmapped is what of a residual layer's blocks does not map, or "".
func ortUnmapped(l *Layer, blocks ...any) string {
	for _, b := range blocks {
		o, ok := b.(ORTBlock)
		if !ok {
			return fmt.Sprintf("its %T block (no ORT form yet)", b)
		}
		if why := o.ORTUnmapped(l); why != "" {
			return why
		}
	}
	return ""
}

// ORTUnmapped: attention maps onto GroupQueryAttention but for sinks,
// output gates, masks of its own (sliding windows) and RoPEs of its own.
func (a *Attention) ORTUnmapped(l *Layer) string {
	switch {
	case a.Mask != "" && a.Mask != CtxMask && a.block.LocalWindow == 0:
		return fmt.Sprintf("attention masked by %s, which is not a sliding window", a.Mask)
	case a.RoPE != "":
		return fmt.Sprintf("attention turning by RoPE %s", a.RoPE)
	}
	return a.block.ORTUnmapped()
}

// ORTUnmapped: a gated MLP is standard ops in any form.
func (s *SwiGLU) ORTUnmapped(*Layer) string { return "" }

// ortLayerInputs are newLayer's inputs in the ORT form: the hidden state,
// the KV cache and GroupQueryAttention's context values.
func ortLayerInputs(f *fn.Func) (hidden fn.Value, c blocks.AttentionContext) {
	hidden = f.Input(sdk.HiddenStates)
	c.PastKey, c.PastValue = f.Input(PastKey), f.Input(PastValue)
	c.ORT = blocks.ORTContext{SeqlensK: f.Input(CtxSeqlensK), TotalSeqLen: f.Input(CtxTotalSeqLen),
		Cos: f.Input(CtxCosCache), Sin: f.Input(CtxSinCache)}
	return hidden, c
}

// ortPlan turns the plan into the ORT form's: attention_mask in, the ORT
// context values, the cache's length past_sequence_length, genai's sizes.
func (m *Model) ortPlan(plan *pb.PlanResponse) {
	plan.ContextOutputs = append([]string(nil), ORTContext...)
	plan.ExtraInputs = []*pb.IOSpec{{Name: sdk.AttentionMask, Dtype: "int64",
		Shape: []*pb.Dim{DimParam("batch_size"), DimParam("total_sequence_length")}}}
	plan.Models = nil
	plan.OrtDecoder = &pb.OrtDecoder{NumAttentionHeads: int32(m.Heads), NumKeyValueHeads: int32(m.KVHeads),
		HeadSize: int32(m.HeadDim), HiddenSize: int32(m.Hidden), ContextLength: m.ortContextLength,
		LastTokenLogits: m.ortLastLogits()}
}

// ortContextPart computes seqlens_k, total_sequence_length and the RoPE
// caches from attention_mask.
func ortContextPart(domain, name string, dt fn.DType, rope blocks.RoPE, contextLength int64) *pb.BuildResponse {
	f := fn.NewFunc(domain, name, dt)
	c := blocks.ORTContextValues(f, f.Input(sdk.AttentionMask), rope, contextLength)
	f.Output(CtxSeqlensK, c.SeqlensK)
	f.Output(CtxTotalSeqLen, c.TotalSeqLen)
	f.Output(CtxCosCache, c.Cos)
	f.Output(CtxSinCache, c.Sin)
	return Response(f)
}

// ortFinalPart norms every position and projects it to float32 logits
// [B,S,vocab], or with last only each row's last attended token's
// [B,1,vocab] (--logits last: onnxruntime-genai reads a pruned model's one
// row as is). The norm runs before the pick so that the host still fuses it
// with the last layer's residual add.
func ortFinalPart(domain, name string, dt fn.DType, kind blocks.Norm, softCap float64, norm, head weight.Expr, last bool) *pb.BuildResponse {
	f := fn.NewFunc(domain, name, dt)
	hidden, normW, headW := f.Input(sdk.HiddenStates), f.Input("norm.weight"), f.Input("lm_head.weight")
	normed := kind.Apply(f.Scope("norm"), hidden, normW)
	if last {
		normed = blocks.LastAttendedToken(f.Scope("last"), normed, f.Input(sdk.AttentionMask))
	}
	logits := blocks.Linear{Weight: headW, ORT: true}.Apply(f.Scope("lm_head"), normed)
	f.Output(sdk.Logits, f.CastTo(blocks.SoftCap(f.Scope("softcap"), logits, softCap), dt, fn.Float32))
	return Response(f, &pb.LayerWeights{Layer: sdk.NonLayer, Bindings: []*pb.WeightBinding{
		weight.Bind("norm.weight", norm), weight.Bind("lm_head.weight", head)}})
}
