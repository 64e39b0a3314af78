package qwen3vl

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/weight"
)

// expertLayout is the orientation of a layer's fused experts, found from
// their shapes: both keep mlp.experts.gate_up_proj and mlp.experts.down_proj
// (no .weight suffix), gate first along the 2I axis.
type expertLayout int

const (
	// layoutHub: gate_up_proj [E, H, 2I], down_proj [E, I, H] (the Hub
	// releases; x·W, gate = [..., :I]).
	layoutHub expertLayout = iota + 1
	// layoutTransformers: gate_up_proj [E, 2I, H], down_proj [E, H, I]
	// (what transformers 5 holds in memory and save_pretrained writes; x·Wᵀ).
	layoutTransformers
)

func (l expertLayout) String() string {
	switch l {
	case layoutHub:
		return "fused [E,H,2I] (Hub)"
	case layoutTransformers:
		return "fused [E,2I,H] (transformers)"
	}
	return "unknown"
}

// detectLayout tells layer l's orientation from the shapes of both fused
// tensors. With hidden_size == 2 × moe_intermediate_size gate_up_proj is
// [E, H, H] either way: transformers' own loader then guesses (it keeps a
// tensor whose shape already fits), so strata refuses rather than guess too.
func detectLayout(c decoder.QwenMoE, m *decoder.Model, l int32) (expertLayout, error) {
	e, h, i := int64(c.Experts), int64(m.Hidden), int64(c.Intermediate)
	gu, ok := m.LayerTensor(l, "mlp.experts.gate_up_proj")
	if !ok {
		if m.HasLayerTensor(l, "mlp.experts.0.gate_proj.weight") {
			return 0, fmt.Errorf("layer %d holds per-expert tensors (%s); Qwen3-VL-MoE checkpoints fuse them (mlp.experts.gate_up_proj): re-save with transformers",
				l, m.LayerKey(l, "mlp.experts.0.gate_proj.weight"))
		}
		return 0, fmt.Errorf("layer %d is a MoE layer but has no tensor %s", l, m.LayerKey(l, "mlp.experts.gate_up_proj"))
	}
	down, ok := m.LayerTensor(l, "mlp.experts.down_proj")
	if !ok {
		return 0, fmt.Errorf("layer %d is a MoE layer but has no tensor %s", l, m.LayerKey(l, "mlp.experts.down_proj"))
	}
	hubGU, trGU := []int64{e, h, 2 * i}, []int64{e, 2 * i, h}
	hubDown, trDown := []int64{e, i, h}, []int64{e, h, i}
	if h == 2*i && slices.Equal(gu.Shape, hubGU) {
		return 0, fmt.Errorf("tensor %s is %v: with hidden_size %d = 2 × moe_intermediate_size its shape cannot tell the Hub orientation [E, H, 2I] from transformers' [E, 2I, H]; strata refuses to guess",
			m.LayerKey(l, "mlp.experts.gate_up_proj"), gu.Shape, h)
	}
	var lay expertLayout
	switch {
	case slices.Equal(gu.Shape, hubGU):
		lay = layoutHub
	case slices.Equal(gu.Shape, trGU):
		lay = layoutTransformers
	default:
		return 0, fmt.Errorf("tensor %s has shape %v; config.json implies %v (Hub: experts, hidden_size, 2×moe_intermediate_size) or %v (transformers)",
			m.LayerKey(l, "mlp.experts.gate_up_proj"), gu.Shape, hubGU, trGU)
	}
	want := map[expertLayout][]int64{layoutHub: hubDown, layoutTransformers: trDown}[lay]
	if !slices.Equal(down.Shape, want) {
		return 0, fmt.Errorf("tensor %s has shape %v; with gate_up_proj %v (%s) it must be %v",
			m.LayerKey(l, "mlp.experts.down_proj"), down.Shape, gu.Shape, lay, want)
	}
	return lay, nil
}

type expertPart int

const (
	gatePart expertPart = iota
	upPart
	downPart
)

// stacked is layer l's experts as the second matmul operand: gate and up
// [E,H,I], down [E,I,H].
func (lay expertLayout) stacked(c decoder.QwenMoE, m *decoder.Model, l int32, part expertPart) weight.Expr {
	e, h, i := int64(c.Experts), int64(m.Hidden), int64(c.Intermediate)
	gu, down := m.LayerKey(l, "mlp.experts.gate_up_proj"), m.LayerKey(l, "mlp.experts.down_proj")
	start := int64(part) * i // gate, then up
	if lay == layoutHub {
		if part == downPart {
			return weight.Tensor(down, e, i, h)
		}
		return weight.Slice(weight.Tensor(gu, e, h, 2*i), 2, start, start+i, 1)
	}
	if part == downPart {
		return weight.Transpose(weight.Tensor(down, e, h, i), 0, 2, 1)
	}
	return weight.Transpose(weight.Slice(weight.Tensor(gu, e, 2*i, h), 1, start, start+i, 1), 0, 2, 1)
}
