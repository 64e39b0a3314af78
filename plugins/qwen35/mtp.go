package qwen35

import (
	"fmt"
	"slices"
	"strings"

	"github.com/strata-llm/strata/sdk/decoder"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// mtpIndexed is the MTP convention of top-level mtp.* keys, every
// release's: mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden,
// mtp.layers.{j}.*, mtp.norm.
const mtpIndexed = "indexed"

// mtpPrefix is where the first MTP layer's decoder-layer keys are.
const mtpPrefix = "mtp.layers.0."

// mtpCount reads the MTP layer count: mtp_num_hidden_layers (Qwen3.5,
// Qwen3-Next's Hub configs) or num_nextn_predict_layers (the name vLLM's
// Qwen3-Next MTP reads), and which field said it.
func mtpCount(m *decoder.Model) (int, string) {
	field := "mtp_num_hidden_layers"
	if !m.Config.Has(field) {
		field = "num_nextn_predict_layers"
	}
	return m.IntOr(field, 0), field
}

// mtpLayout reports the multi-token-prediction weights as an indexed
// layout (strata inspect shows it, strata convert keeps it whole). With
// --mtp skip they are left out of the export and said so; with draft
// declareMTP writes them as mtp.onnx.
func mtpLayout(m *decoder.Model) error {
	var keys []string
	for k := range m.Inventory {
		if strings.HasPrefix(k, "mtp.") {
			keys = append(keys, k)
		}
	}
	n, field := mtpCount(m)
	draft := m.Options[decoder.MTPOptionName] == decoder.MTPDraft
	switch {
	case m.Err != nil:
		return m.Err
	case len(keys) == 0 && draft:
		return fmt.Errorf("--mtp draft: the checkpoint holds no mtp.* tensor (%s is %d); export without --mtp draft", field, n)
	case len(keys) == 0 && n > 0:
		m.Note("config.json declares %d MTP layer(s) (%s), but the checkpoint holds no mtp.* tensor", n, field)
	case len(keys) == 0:
	case !draft:
		m.Note("the MTP weights (%d mtp.* tensors; %s %d) are left out of the export (--mtp draft exports them as mtp.onnx)", len(keys), field, n)
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	m.MTP = &pb.MTPLayout{Convention: mtpIndexed, Keys: keys}
	return nil
}

// declareMTP declares the draft (decoder.Draft) when the checkpoint has
// MTP weights: with --mtp draft it is written as mtp.onnx and model.onnx
// also returns hidden_states; without, asking for mtp.onnx is refused
// with the option to set.
func declareMTP(m *decoder.Model, name string, mlps mlps, attn func(mlp string) func(*decoder.Layer) error) error {
	if m.MTP == nil {
		return nil
	}
	draft := m.Options[decoder.MTPOptionName] == decoder.MTPDraft
	if dedicated, err := m.Config.BoolOr("mtp_use_dedicated_embeddings", false); draft && (err != nil || dedicated) {
		return fmt.Errorf("--mtp draft: %s: mtp_use_dedicated_embeddings is not false; the draft (as vLLM's Qwen3.5 / Qwen3-Next MTP) reads the main model's embedding, so export without --mtp draft", m.Config.Path())
	}
	if draft && m.Options[decoder.VisionOptionName] == "true" {
		return fmt.Errorf("--mtp draft with --vision true is not implemented: the draft's positions would be the image's MRoPE rows; export the draft without vision inputs, or vision without the draft")
	}
	layer := int32(m.Layers)
	m.StoreLayer(layer, mtpPrefix)
	mlp, err := mtpMLP(m, mlps, layer, draft)
	if err != nil {
		return err
	}
	if n, _ := mtpCount(m); draft && n > 1 {
		m.Note("mtp.onnx is the first MTP layer (%s*) of %d; vLLM runs layer j at speculative step j mod %d", mtpPrefix, n, n)
	}
	kind := kindName(fullType, mlp)
	if !m.HasKind(kind) {
		m.SideKind(kind, name+kindFunction[fullType]+kindFunction[mlp]+"DecoderLayer", attn(mlp))
	}
	return newDraft(m, layer, kind).Declare(draft)
}

// mtpMLP is the MTP layer's MLP kind, as its keys say: a sparse MoE
// (mlp.gate) or a dense SwiGLU (mlp.gate_proj). vLLM builds it by the
// layer's index within mtp.layers, which the keys follow.
func mtpMLP(m *decoder.Model, mlps mlps, layer int32, draft bool) (string, error) {
	switch {
	case m.Inventory.Has(m.LayerKey(layer, "mlp.gate.weight")):
		if mlps.stored == nil {
			return "", fmt.Errorf("%smlp.gate.weight is a MoE router, but config.json declares no experts (num_experts); the MTP layer cannot be built", mtpPrefix)
		}
		if !draft {
			return mlpMoE, nil
		}
		if err := mlps.stored.Detect(m, layer); err != nil {
			return "", fmt.Errorf("--mtp draft: MTP layer %s*: %w", mtpPrefix, err)
		}
		return mlpMoE, nil
	case m.Inventory.Has(m.LayerKey(layer, "mlp.gate_proj.weight")):
		return mlpDense, nil
	case draft:
		return "", fmt.Errorf("--mtp draft: the checkpoint holds neither %smlp.gate.weight (MoE) nor %smlp.gate_proj.weight (dense); cannot tell the MTP layer's MLP", mtpPrefix, mtpPrefix)
	}
	return mlpDense, nil
}

// newDraft is the MTP layer as vLLM's Qwen3NextMultiTokenPredictor and
// Qwen3_5MultiTokenPredictor run it: fc over [pre_fc_norm_embedding(e),
// pre_fc_norm_hidden(h)] (no zeroing at position 0), the full-attention
// decoder layer, mtp.norm, the main model's embedding and head. Every norm
// weighs by 1 + w.
func newDraft(m *decoder.Model, layer int32, kind string) *decoder.Draft {
	h := int64(m.Hidden)
	own := func(name string, shape ...int64) decoder.NamedWeight {
		return decoder.NamedWeight{Input: "mtp." + name, Expr: weight.Tensor("mtp."+name, shape...)}
	}
	return &decoder.Draft{Model: m, Layer: layer, Kind: kind,
		Embed:     decoder.NamedWeight{Input: "embed_tokens.weight", Expr: m.EmbedWeight()},
		EmbedNorm: own("pre_fc_norm_embedding.weight", h), HiddenNorm: own("pre_fc_norm_hidden.weight", h),
		Proj: own("fc.weight", h, 2*h), FinalNorm: own("norm.weight", h),
		Head: decoder.NamedWeight{Input: "lm_head.weight", Expr: m.HeadWeight()}}
}
