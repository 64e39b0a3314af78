package decoder

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/weight"
)

// Gated experts as MoE checkpoints store them under mlp.experts.: one set
// of tensors per expert (the Hub releases of Qwen3-MoE, GLM-4.x, DeepSeek)
// or fused (what transformers 5 holds in memory and some re-saves write).
// Which one a layer uses is found from its keys: re-saves differ from the
// release, so model_type does not tell.

// ExpertLayout is how a layer's experts are stored.
type ExpertLayout int

const (
	// PerExpert: mlp.experts.<e>.{gate,up}_proj.weight [I,H], down_proj.weight [H,I].
	PerExpert ExpertLayout = iota + 1
	// FusedRows: mlp.experts.gate_up_proj [E,2I,H] (gate rows first),
	// mlp.experts.down_proj [E,H,I]. (Qwen3-VL-MoE's [E,H,2I] is another
	// orientation, refused by the shape check.)
	FusedRows
)

// StoredExperts are a model's routed experts: how many (and the config
// field that says so, for errors), their width, and each MoE layer's
// layout once Detect found it.
type StoredExperts struct {
	Count        int
	CountField   string // e.g. num_experts, n_routed_experts
	Intermediate int    // moe_intermediate_size
	Layouts      map[int32]ExpertLayout
}

// ExpertName is expert e's projection proj under a layer: mlp.experts.<e>.<proj>.weight.
func ExpertName(e int, proj string) string {
	return "mlp.experts." + strconv.Itoa(e) + "." + proj + ".weight"
}

// Detect finds layer l's layout from its keys. A count the tensors cannot
// back is refused from one key (the last expert's), not by listing them.
func (s *StoredExperts) Detect(m *Model, l int32) error {
	first, last := ExpertName(0, "gate_proj"), ExpertName(s.Count-1, "gate_proj")
	if s.Layouts == nil {
		s.Layouts = map[int32]ExpertLayout{}
	}
	if m.HasLayerTensor(l, first) {
		if !m.HasLayerTensor(l, last) {
			return fmt.Errorf("%s: %s is %d, but layer %d has no tensor %s", m.Config.Path(), s.CountField, s.Count, l, m.LayerKey(l, last))
		}
		s.Layouts[l] = PerExpert
		return nil
	}
	t, ok := m.LayerTensor(l, "mlp.experts.gate_up_proj")
	if !ok {
		return fmt.Errorf("layer %d is a MoE layer but holds neither per-expert tensors (%s) nor fused ones (%s)",
			l, m.LayerKey(l, first), m.LayerKey(l, "mlp.experts.gate_up_proj"))
	}
	want := []int64{int64(s.Count), 2 * int64(s.Intermediate), int64(m.Hidden)}
	if !slices.Equal(t.Shape, want) {
		return fmt.Errorf("tensor %s has shape %v; config.json implies %v (experts, 2×moe_intermediate_size, hidden_size)",
			m.LayerKey(l, "mlp.experts.gate_up_proj"), t.Shape, want)
	}
	s.Layouts[l] = FusedRows
	return nil
}

// Declare declares the stacked experts of a MoE layer as the second matmul
// operand, gate and up [E,H,I], down [E,I,H], each layer bound from its
// own layout (formal inputs mlp.experts.gate, .up, .down).
func (s *StoredExperts) Declare(l *Layer) (gate, up, down fn.Value) {
	stacked := func(name string, part int) fn.Value {
		return l.Computed(name, func(i int32) weight.Expr { return s.stacked(l.Model, i, part) })
	}
	return stacked("mlp.experts.gate", 0), stacked("mlp.experts.up", 1), stacked("mlp.experts.down", 2)
}

// DeclareFused declares the experts as ONNX Runtime's MoE op takes them
// (blocks.ORTMoE): fc1 [E,2I,H], each expert's gate and up rows
// interleaved, and fc2 [E,H,I], the down projections as stored (formal
// inputs mlp.experts.fc1, .fc2).
func (s *StoredExperts) DeclareFused(l *Layer) (fc1, fc2 fn.Value) {
	fc1 = l.Computed("mlp.experts.fc1", func(i int32) weight.Expr { return s.interleaved(l.Model, i) })
	fc2 = l.Computed("mlp.experts.fc2", func(i int32) weight.Expr { return s.rows(l.Model, i, 2) })
	return fc1, fc2
}

// interleaved is layer l's gate and up rows interleaved, [E,2I,H]. Per
// expert, gate and up side by side ([I,2H]) are those rows interleaved
// ([1,2I,H] reshaped): one copy each where ONNX Runtime folds them, and
// materialising computes one expert at a time (transform.Parts).
func (s *StoredExperts) interleaved(m *Model, l int32) weight.Expr {
	e, h, i := int64(s.Count), int64(m.Hidden), int64(s.Intermediate)
	if s.Layouts[l] == PerExpert {
		ws := make([]weight.Expr, s.Count)
		for x := range ws {
			gate := weight.Tensor(m.LayerKey(l, ExpertName(x, "gate_proj")), i, h)
			up := weight.Tensor(m.LayerKey(l, ExpertName(x, "up_proj")), i, h)
			ws[x] = weight.Reshape(weight.Concat(1, gate, up), 1, 2*i, h)
		}
		return weight.Concat(0, ws...)
	}
	return weight.Reshape(weight.Concat(2, s.rows(m, l, 0), s.rows(m, l, 1)), e, 2*i, h)
}

// stacked is layer l's part (0 gate, 1 up, 2 down) as the second matmul
// operand: gate and up [E,H,I], down [E,I,H].
func (s *StoredExperts) stacked(m *Model, l int32, part int) weight.Expr {
	return weight.Transpose(s.rows(m, l, part), 0, 2, 1)
}

// rows is layer l's part (0 gate, 1 up, 2 down) stacked as stored, rows
// the outputs: gate and up [E,I,H], down [E,H,I].
func (s *StoredExperts) rows(m *Model, l int32, part int) weight.Expr {
	e, h, i := int64(s.Count), int64(m.Hidden), int64(s.Intermediate)
	if s.Layouts[l] == PerExpert {
		proj, shape := [...]string{"gate_proj", "up_proj", "down_proj"}[part], []int64{i, h}
		if part == 2 {
			shape = []int64{h, i}
		}
		ws := make([]weight.Expr, s.Count)
		experts := m.LayerKey(l, "mlp.experts.")
		suffix := "." + proj + ".weight"
		for x := range ws { // numeric order: expert 10 after 9
			ws[x] = weight.Tensor(experts+strconv.Itoa(x)+suffix, shape...)
		}
		return weight.Stack(0, ws...)
	}
	if part == 2 {
		return weight.Tensor(m.LayerKey(l, "mlp.experts.down_proj"), e, h, i)
	}
	fused := weight.Tensor(m.LayerKey(l, "mlp.experts.gate_up_proj"), e, 2*i, h)
	start := int64(part) * i // gate rows, then up rows
	return weight.Slice(fused, 1, start, start+i, 1)
}

// RoutedExperts runs a MoE MLP on x [B,S,H]: tokens flattened, routed (the
// router's nodes under routerScope), the chosen experts run by strategy,
// the result shaped back like x.
func RoutedExperts(f *fn.Func, x fn.Value, hidden int, router blocks.Router, routerScope string, experts blocks.Experts, strategy string) (fn.Value, error) {
	tokens := f.Reshape(x, -1, int64(hidden)) // [T,H]
	w, idx, err := router.Route(f.Scope(routerScope), tokens)
	if err != nil {
		return "", err
	}
	y, err := experts.Apply(f.Scope("experts"), strategy, tokens, w, idx, router.Experts)
	if err != nil {
		return "", err
	}
	return f.Op("Reshape", []fn.Value{y, f.Shape(x)}), nil
}
