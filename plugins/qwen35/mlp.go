package qwen35

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
)

// MLP kinds.
const (
	mlpMoE   = "moe"
	mlpDense = "dense"
)

// mlps are the model's MLPs: the sparse MoE with its shared expert where
// the family has one, a dense SwiGLU elsewhere.
type mlps struct {
	model  *decoder.Model
	moe    decoder.QwenMoE
	shared int // shared_expert_intermediate_size
	stored *decoder.StoredExperts
	sparse func(i int) bool
}

// readMLPs reads the MoE fields of the MoE families and finds each MoE
// layer's expert layout.
func readMLPs(m *decoder.Model, fam family) (mlps, error) {
	ms := mlps{model: m, sparse: func(int) bool { return false }}
	if fam.mlp == mlpDense {
		return ms, nil
	}
	ms.moe = decoder.ReadQwenMoE(m)
	ms.shared = m.Int("shared_expert_intermediate_size")
	switch fam.mlp {
	case "qwen": // Qwen3-Next: transformers' Qwen MoE rule and norm_topk_prob
		ms.moe.Normalize = m.BoolOr("norm_topk_prob", true)
		ms.sparse = ms.moe.Sparse
	default: // Qwen3.5-MoE: every layer, always renormalised
		ms.moe.Normalize, ms.moe.SparseStep, ms.moe.MLPOnly = true, 1, nil
		ms.sparse = func(int) bool { return true }
	}
	if m.Err != nil {
		return ms, m.Err
	}
	if err := ms.moe.Check(m); err != nil {
		return ms, err
	}
	if ms.shared <= 0 {
		return ms, fmt.Errorf("%s: shared_expert_intermediate_size must be positive, got %d", m.Config.Path(), ms.shared)
	}
	ms.stored = &decoder.StoredExperts{Count: ms.moe.Experts, CountField: "num_experts", Intermediate: ms.moe.Intermediate}
	return ms, m.EveryLayer(func(i int32) error {
		if !ms.sparse(int(i)) {
			return nil
		}
		return ms.stored.Detect(m, i)
	})
}

// kind is layer i's MLP kind.
func (ms mlps) kind(i int) string {
	if ms.sparse(i) {
		return mlpMoE
	}
	return mlpDense
}

// block is a fresh MLP block of the kind.
func (ms mlps) block(kind string) decoder.Block {
	if kind == mlpDense {
		return &decoder.SwiGLU{Width: ms.model.Intermediate}
	}
	return &sharedExpertMoE{routed: ms.moe.Block(ms.model.Options[decoder.MoEStrategy], ms.stored.Declare),
		shared: &decoder.SwiGLU{Name: "mlp.shared_expert", Width: ms.shared}}
}

// sharedExpertMoE is the routed experts plus a shared expert weighed by
// sigmoid(shared_expert_gate(x)).
type sharedExpertMoE struct {
	routed decoder.Block
	shared *decoder.SwiGLU
	gate   blocks.Linear
}

func (b *sharedExpertMoE) Declare(l *decoder.Layer) {
	b.routed.Declare(l)
	b.shared.Declare(l)
	b.gate = l.Linear("mlp.shared_expert_gate", 1, l.Model.Hidden, false)
}

func (b *sharedExpertMoE) Apply(l *decoder.Layer, f *fn.Func, x fn.Value) (fn.Value, error) {
	routed, err := b.routed.Apply(l, f, x)
	if err != nil {
		return "", err
	}
	shared, err := b.shared.Apply(l, f.Scope("shared_expert"), x)
	if err != nil {
		return "", err
	}
	weight := f.Sigmoid(b.gate.Apply(f.Scope("shared_expert_gate"), x))
	return f.Add(routed, f.Mul(weight, shared)), nil
}
