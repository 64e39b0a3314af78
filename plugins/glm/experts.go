package main

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/weight"
)

// expertLayout is how a checkpoint stores a layer's experts, found from
// the keys present (re-saves differ from the Hub release, so model_type
// does not tell).
type expertLayout int

const (
	// perExpert: mlp.experts.<e>.{gate,up}_proj.weight [I,H], down_proj.weight [H,I]
	// (Hub releases; what transformers 5 writes back).
	perExpert expertLayout = iota + 1
	// fusedRows: mlp.experts.gate_up_proj [E,2I,H] (gate rows first),
	// mlp.experts.down_proj [E,H,I] (transformers 5 in memory, some re-saves).
	// (Qwen3-VL-MoE's [E,H,2I] layout belongs to another model_type and is
	// refused with the shape error below.)
	fusedRows
)

func (c config) detectLayout(m *decoder.Model, l int32) (expertLayout, error) {
	first, last := expertName(0, "gate_proj"), expertName(c.experts-1, "gate_proj")
	if m.HasLayerTensor(l, first) {
		if !m.HasLayerTensor(l, last) { // a count the tensors cannot back, found without listing them all
			return 0, fmt.Errorf("config.json: n_routed_experts is %d, but layer %d has no tensor %s", c.experts, l, m.LayerKey(l, last))
		}
		return perExpert, nil
	}
	t, ok := m.LayerTensor(l, "mlp.experts.gate_up_proj")
	if !ok {
		return 0, fmt.Errorf("layer %d is a MoE layer but holds neither per-expert tensors (%s) nor fused ones (%s)",
			l, m.LayerKey(l, first), m.LayerKey(l, "mlp.experts.gate_up_proj"))
	}
	want := []int64{int64(c.experts), 2 * int64(c.moeIntermediate), int64(m.Hidden)}
	if !slices.Equal(t.Shape, want) {
		return 0, fmt.Errorf("tensor %s has shape %v; config.json implies %v (experts, 2×moe_intermediate_size, hidden_size)",
			m.LayerKey(l, "mlp.experts.gate_up_proj"), t.Shape, want)
	}
	return fusedRows, nil
}

func expertName(e int, proj string) string { return fmt.Sprintf("mlp.experts.%d.%s.weight", e, proj) }

type expertPart int

const (
	gatePart expertPart = iota
	upPart
	downPart
)

// stacked is the weight expression of layer l's stacked experts, as the
// second matmul operand: gate and up [E,H,I], down [E,I,H].
func (lay expertLayout) stacked(c config, m *decoder.Model, l int32, part expertPart) weight.Expr {
	e, h, i := int64(c.experts), int64(m.Hidden), int64(c.moeIntermediate)
	if lay == perExpert {
		proj, shape := [...]string{"gate_proj", "up_proj", "down_proj"}[part], []int64{i, h}
		if part == downPart {
			shape = []int64{h, i}
		}
		ws := make([]weight.Expr, c.experts)
		for x := range ws { // numeric order: expert 10 after 9
			ws[x] = weight.Tensor(m.LayerKey(l, expertName(x, proj)), shape...)
		}
		return weight.Transpose(weight.Stack(0, ws...), 0, 2, 1)
	}
	if part == downPart {
		return weight.Transpose(weight.Tensor(m.LayerKey(l, "mlp.experts.down_proj"), e, h, i), 0, 2, 1)
	}
	fused := weight.Tensor(m.LayerKey(l, "mlp.experts.gate_up_proj"), e, 2*i, h)
	start := int64(part) * i // gate rows, then up rows
	return weight.Transpose(weight.Slice(fused, 1, start, start+i, 1), 0, 2, 1)
}
