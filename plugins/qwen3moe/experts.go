package main

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/build"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
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

func (c config) detectLayout(inv sdk.Inventory, l int32) (expertLayout, error) {
	if inv.Has(build.LayerKey(l, "mlp.experts.0.gate_proj.weight")) {
		return perExpert, nil
	}
	t, ok := inv[build.LayerKey(l, "mlp.experts.gate_up_proj")]
	if !ok {
		return 0, fmt.Errorf("layer %d is a MoE layer but holds neither per-expert tensors (%s) nor fused ones (%s)",
			l, build.LayerKey(l, "mlp.experts.0.gate_proj.weight"), build.LayerKey(l, "mlp.experts.gate_up_proj"))
	}
	want := []int64{int64(c.experts), 2 * int64(c.moeIntermediate), int64(c.hidden)}
	if !slices.Equal(t.Shape, want) {
		return 0, fmt.Errorf("tensor %s has shape %v; config.json implies %v (experts, 2×moe_intermediate_size, hidden_size)",
			build.LayerKey(l, "mlp.experts.gate_up_proj"), t.Shape, want)
	}
	return fusedRows, nil
}

// moeTensors lists a MoE layer's router and expert tensors in its layout.
func (c config) moeTensors(l int32) []sdk.ExpectedTensor {
	e, h, i := int64(c.experts), int64(c.hidden), int64(c.moeIntermediate)
	out := []sdk.ExpectedTensor{{Key: build.LayerKey(l, "mlp.gate.weight"), Shape: []int64{e, h}}}
	switch c.layouts[l] {
	case perExpert:
		for x := range c.experts {
			out = append(out,
				sdk.ExpectedTensor{Key: expertKey(l, x, "gate_proj"), Shape: []int64{i, h}},
				sdk.ExpectedTensor{Key: expertKey(l, x, "up_proj"), Shape: []int64{i, h}},
				sdk.ExpectedTensor{Key: expertKey(l, x, "down_proj"), Shape: []int64{h, i}})
		}
	case fusedRows:
		out = append(out,
			sdk.ExpectedTensor{Key: build.LayerKey(l, "mlp.experts.gate_up_proj"), Shape: []int64{e, 2 * i, h}},
			sdk.ExpectedTensor{Key: build.LayerKey(l, "mlp.experts.down_proj"), Shape: []int64{e, h, i}})
	}
	return out
}

func expertKey(l int32, e int, proj string) string {
	return build.LayerKey(l, fmt.Sprintf("mlp.experts.%d.%s.weight", e, proj))
}

// experts are the weight expressions of a layer's stacked experts, as the
// second matmul operand: gate and up [E,H,I], down [E,I,H].
func (lay expertLayout) experts(c config, l int32) (gate, up, down *pb.Weight) {
	i := int64(c.moeIntermediate)
	fused := build.Tensor(build.LayerKey(l, "mlp.experts.gate_up_proj"))
	fusedDown := build.Tensor(build.LayerKey(l, "mlp.experts.down_proj"))
	if lay == perExpert {
		stack := func(proj string) *pb.Weight {
			ws := make([]*pb.Weight, c.experts)
			for e := range ws { // numeric order: expert 10 after 9
				ws[e] = build.Tensor(expertKey(l, e, proj))
			}
			return build.TransposeWeight(build.StackWeights(0, ws...), 0, 2, 1)
		}
		return stack("gate_proj"), stack("up_proj"), stack("down_proj")
	}
	half := func(start int64) *pb.Weight { // fusedRows: gate rows, then up rows
		return build.TransposeWeight(build.SliceWeight(fused, 1, start, start+i, 1), 0, 2, 1)
	}
	return half(0), half(i), build.TransposeWeight(fusedDown, 0, 2, 1)
}
