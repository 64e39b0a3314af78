package decoder

import (
	"fmt"
	"math"
	"slices"
	"strings"

	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// The DeepSeek-style MTP ("NextN") layer as the GLM-4.x, DeepSeek-V3 and
// Kimi-K2 releases store it, found in the checkpoint and declared as the
// draft model (mtp.onnx); from the glm plugin, shared.

// MTP conventions (MTPLayout.convention).
const (
	// MTPInlined: model.layers.{N} for N in [num_hidden_layers,
	// num_hidden_layers + num_nextn_predict_layers) — the GLM-4.x releases.
	MTPInlined = "inlined"
	// MTPIndexed: top-level mtp.* keys listed in the index.
	MTPIndexed = "indexed"
	// MTPSeparateFile: the inlined layer's keys in a standalone
	// mtp.safetensors the index does not name (some GLM-4.7 repacks); the
	// host marks such tensors unindexed.
	MTPSeparateFile = "separate-file"
)

// NextN is what Load found of the MTP layers, and whether the draft is
// asked for.
type NextN struct {
	layout *pb.MTPLayout
	draft  bool
}

// Draft reports whether --mtp draft asks for the draft.
func (info NextN) Draft() bool { return info.draft }

// Layers are the MTP layers the checkpoint holds inlined.
func (info NextN) Layers() []int32 { return info.layout.GetLayers() }

// DetectNextN finds the MTP layers the config declares (num_nextn_predict_layers;
// null is 0) and those the checkpoint holds. With --mtp skip, declared but
// absent or present but undeclared layers are notes (transformers itself
// saves num_nextn_predict_layers 1 without any MTP weight); with draft
// they are errors.
func DetectNextN(m *Model) (NextN, error) {
	n := m.IntOr("num_nextn_predict_layers", 0)
	if m.Err != nil {
		return NextN{}, m.Err
	}
	if n < 0 {
		return NextN{}, fmt.Errorf("config.json: num_nextn_predict_layers must be ≥ 0, got %d", n)
	}
	info := NextN{draft: m.Options[MTPOptionName] == MTPDraft}
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
		info.layout = &pb.MTPLayout{Convention: MTPInlined}
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
			info.layout.Convention = MTPSeparateFile
		}
	} else if len(indexed) > 0 {
		info.layout = &pb.MTPLayout{Convention: MTPIndexed, Keys: indexed}
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
	case info.layout.GetConvention() == MTPIndexed && info.draft:
		return info, fmt.Errorf("--mtp draft: the MTP weights are top-level mtp.* keys (%s, ...); strata builds the %s draft from inlined model.layers.{N} only", indexed[0], m.arch.ModelType)
	case info.layout != nil && !info.draft:
		m.Note("MTP layer(s) %s (%s, %d tensors) are left out of the export (--mtp draft exports them as mtp.onnx)",
			layerList(info.layout.GetLayers()), info.layout.GetConvention(), len(info.layout.GetKeys()))
	}
	return info, nil
}

// missingSpan names the declared MTP layers first..first+n-1 the checkpoint
// does not hold: each of a few, else how many and their range.
func missingSpan(m *Model, first, n int, present []int) string {
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

// Declare records the layout in the plan and, with --mtp draft, makes the
// main model also return its final hidden states and declares mtp.onnx,
// the layer of kind kindOf(layer).
func (info NextN) Declare(m *Model, kindOf func(i int) string) error {
	m.MTP = info.layout
	if len(info.layout.GetLayers()) == 0 { // none, or indexed mtp.* keys (refused with draft by detectMTP)
		return nil
	}
	layer := info.layout.GetLayers()[0]
	if info.draft && len(info.layout.GetLayers()) > 1 {
		m.Note("mtp.onnx is the first MTP layer (%d) of %d", layer, len(info.layout.GetLayers()))
	}
	return NextNDraft(m, layer, kindOf(int(layer))).Declare(info.draft)
}

// NextNDraft is the MTP layer as vLLM's Glm4MoeMultiTokenPredictorLayer
// and DeepSeekMultiTokenPredictorLayer run it (Draft): embedding zeroed at position 0, enorm, hnorm,
// eh_proj, the decoder layer, shared_head.norm, shared_head.head.
// embed_tokens and shared_head.head are the MTP layer's own when the
// checkpoint has them, else the main model's.
func NextNDraft(m *Model, layer int32, kind string) *Draft {
	h := int64(m.Hidden)
	key := func(name string) string { return m.LayerKey(layer, name) }
	own := func(name string, shape ...int64) NamedWeight {
		return NamedWeight{Input: name, Expr: weight.Tensor(key(name), shape...)}
	}
	embed, head := m.EmbedWeight(), m.HeadWeight()
	if m.Inventory.Has(key("embed_tokens.weight")) {
		embed = weight.Tensor(key("embed_tokens.weight"), int64(m.Vocab), h)
	}
	if m.Inventory.Has(key("shared_head.head.weight")) {
		head = weight.Tensor(key("shared_head.head.weight"), int64(m.Vocab), h)
	}
	return &Draft{Model: m, Layer: layer, Kind: kind, ZeroFirst: true,
		Embed:     NamedWeight{Input: "embed_tokens.weight", Expr: embed},
		EmbedNorm: own("enorm.weight", h), HiddenNorm: own("hnorm.weight", h), Proj: own("eh_proj.weight", h, 2*h),
		FinalNorm: own("shared_head.norm.weight", h),
		Head:      NamedWeight{Input: "shared_head.head.weight", Expr: head}}
}
