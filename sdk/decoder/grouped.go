package decoder

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
)

// GroupedMoE is the MoE of DeepSeek-V3 and the GLM-4.x MoE decoders, which
// transformers writes alike (DeepseekV3MoE, Glm4MoeMoE, Glm4MoeLiteMoE): a
// sigmoid router whose choice adds e_score_correction_bias and keeps the
// best topk_group of n_group groups, weights renormalised (norm_topk_prob)
// and scaled (routed_scaling_factor), the routed experts, plus the shared
// experts unweighted.
type GroupedMoE struct {
	Experts, TopK, Intermediate, Shared int
	Groups, TopKGroups                  int
	NormTopK                            bool
	Scale                               float64
	// Stored is each MoE layer's expert layout (MTP layers too), after
	// Detect.
	Stored *StoredExperts
}

// ReadGroupedMoE reads and checks the MoE fields (n_routed_experts,
// num_experts_per_tok, moe_intermediate_size, n_shared_experts, n_group,
// topk_group, norm_topk_prob, routed_scaling_factor); the defaults of
// fields config.json omits are the architecture's (Architecture.Defaults)
// or glm4_moe's.
func ReadGroupedMoE(m *Model) (GroupedMoE, error) {
	c := GroupedMoE{
		Experts: m.FirstInt("n_routed_experts", "num_local_experts"), TopK: m.Int("num_experts_per_tok"),
		Intermediate: m.Int("moe_intermediate_size"), Shared: m.IntOr("n_shared_experts", 1),
		Groups: m.IntOr("n_group", 1), TopKGroups: m.IntOr("topk_group", 1),
		NormTopK: m.BoolOr("norm_topk_prob", true), Scale: m.FloatOr("routed_scaling_factor", 1),
	}
	if m.Err != nil {
		return c, m.Err
	}
	switch {
	case c.Experts < 1:
		return c, fmt.Errorf("config.json: n_routed_experts must be positive, got %d", c.Experts)
	case c.TopK < 1 || c.TopK > c.Experts:
		return c, fmt.Errorf("config.json: num_experts_per_tok %d must be in 1..n_routed_experts (%d)", c.TopK, c.Experts)
	case c.Intermediate <= 0:
		return c, fmt.Errorf("config.json: moe_intermediate_size must be positive, got %d", c.Intermediate)
	case c.Shared < 0:
		return c, fmt.Errorf("config.json: n_shared_experts must be ≥ 0, got %d", c.Shared)
	case c.Groups < 1 || c.Experts%c.Groups != 0:
		return c, fmt.Errorf("config.json: n_group %d must divide n_routed_experts (%d)", c.Groups, c.Experts)
	case c.TopKGroups < 1 || c.TopKGroups > c.Groups:
		return c, fmt.Errorf("config.json: topk_group %d must be in 1..n_group (%d)", c.TopKGroups, c.Groups)
	case c.Experts/c.Groups < 2:
		return c, fmt.Errorf("config.json: n_group %d leaves %d expert per group; a group's score is the sum of its best two", c.Groups, c.Experts/c.Groups)
	case c.TopK > c.TopKGroups*(c.Experts/c.Groups):
		return c, fmt.Errorf("config.json: num_experts_per_tok %d exceeds the experts of the topk_group %d groups kept (%d)",
			c.TopK, c.TopKGroups, c.TopKGroups*(c.Experts/c.Groups))
	case !(c.Scale > 0):
		return c, fmt.Errorf("config.json: routed_scaling_factor must be > 0, got %g", c.Scale)
	}
	c.Stored = &StoredExperts{Count: c.Experts, CountField: "n_routed_experts", Intermediate: c.Intermediate}
	return c, nil
}

// Block is a MoE layer's MLP, its experts run by strategy.
func (c GroupedMoE) Block(strategy string) Block {
	return &groupedMoE{GroupedMoE: c, strategy: strategy}
}

type groupedMoE struct {
	GroupedMoE
	strategy string
	router   blocks.Router
	run      blocks.Experts
	shared   *SwiGLU
}

func (b *groupedMoE) Declare(l *Layer) {
	e, h := int64(b.Experts), int64(l.Model.Hidden)
	b.router = blocks.Router{Kind: blocks.SigmoidGrouped, Experts: b.Experts, TopK: b.TopK, Normalize: b.NormTopK,
		Weight: l.Weight("mlp.gate.weight", e, h), CorrectionBias: l.Weight("mlp.gate.e_score_correction_bias", e),
		Groups: b.Groups, TopKGroups: b.TopKGroups, Scale: b.Scale}
	b.run.Gate, b.run.Up, b.run.Down = b.Stored.Declare(l)
	if b.Shared > 0 {
		b.shared = &SwiGLU{Name: "mlp.shared_experts", Width: b.Intermediate * b.Shared}
		b.shared.Declare(l)
	}
}

// ORTUnmapped: in ONNX Runtime's form the routed experts run as the
// strategy says (gather by default: standard ops), the router's sigmoid
// groups and the shared experts as in any form; ONNX Runtime's MoE contrib
// op (softmax routing only) cannot express the grouped sigmoid router.
func (b *groupedMoE) ORTUnmapped(*Layer) string { return "" }

func (b *groupedMoE) Apply(l *Layer, f *fn.Func, x fn.Value) (fn.Value, error) {
	out, err := RoutedExperts(f, x, l.Model.Hidden, b.router, "gate", b.run, b.strategy)
	if err != nil {
		return "", err
	}
	if b.shared == nil {
		return out, nil
	}
	s, err := b.shared.Apply(l, f.Scope("shared_experts"), x)
	if err != nil {
		return "", err
	}
	return f.Add(out, s), nil
}

// Detect finds the expert layout of every layer of kind moe, and of the
// MTP layers when the draft is asked for.
func (c GroupedMoE) Detect(m *Model, moe string, mtp NextN) error {
	detect := func(i int32) error { return c.Stored.Detect(m, i) }
	if err := m.EveryLayer(detect, moe); err != nil {
		return err
	}
	if mtp.Draft() {
		for _, i := range mtp.Layers() {
			if err := detect(i); err != nil {
				return fmt.Errorf("MTP layer: %w", err)
			}
		}
	}
	return nil
}

// FirstDense is Model.KindOf for first_k_dense_replace: layers below
// firstDense are dense, the rest moe (and so MTP layers past them).
func FirstDense(firstDense int, dense, moe string) (func(i int) string, error) {
	if firstDense < 0 {
		return nil, fmt.Errorf("config.json: first_k_dense_replace must be ≥ 0, got %d", firstDense)
	}
	return func(i int) string {
		if i < firstDense {
			return dense
		}
		return moe
	}, nil
}
