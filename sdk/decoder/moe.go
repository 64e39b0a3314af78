package decoder

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// QwenMoE is the sparse MoE of the Qwen decoders (Qwen3-MoE, Qwen3-VL-MoE):
// which layers are sparse (decoder_sparse_step, mlp_only_layers) and their
// MLP, a softmax router over the experts, top-k, optionally renormalised,
// then the chosen experts run by strategy.
type QwenMoE struct {
	Experts      int   // num_experts (or num_local_experts)
	TopK         int   // num_experts_per_tok
	Intermediate int   // moe_intermediate_size
	SparseStep   int   // decoder_sparse_step: layer i is sparse when (i+1) is a multiple
	MLPOnly      []int // mlp_only_layers: dense whatever the step says
	Normalize    bool  // renormalise the top-k weights to sum to 1 (norm_topk_prob)
}

// ReadQwenMoE reads the MoE fields of m's config (errors in m.Err, as its
// other readers). Normalize is left false: the architectures differ in
// whether norm_topk_prob says it.
func ReadQwenMoE(m *Model) QwenMoE {
	return QwenMoE{
		Experts: m.FirstInt("num_experts", "num_local_experts"), TopK: m.Int("num_experts_per_tok"),
		Intermediate: m.Int("moe_intermediate_size"), SparseStep: m.IntOr("decoder_sparse_step", 1),
		MLPOnly: m.Ints("mlp_only_layers"),
	}
}

// Check refuses values no model can have: top-k outside 1..experts (with
// experts), a sparse step below 1, no expert width.
func (c QwenMoE) Check(m *Model) error {
	path := m.Config.Path()
	switch {
	case c.Experts > 0 && (c.TopK < 1 || c.TopK > c.Experts):
		return fmt.Errorf("%s: num_experts_per_tok %d must be in 1..num_experts (%d)", path, c.TopK, c.Experts)
	case c.SparseStep < 1:
		return fmt.Errorf("%s: decoder_sparse_step must be at least 1, got %d", path, c.SparseStep)
	case c.Intermediate <= 0:
		return fmt.Errorf("%s: moe_intermediate_size must be positive, got %d", path, c.Intermediate)
	}
	return nil
}

// Sparse says whether layer i is a sparse MoE layer, as transformers'
// Qwen MoE decoder layers decide: not in mlp_only_layers, experts at all,
// and (i+1) a multiple of decoder_sparse_step.
func (c QwenMoE) Sparse(i int) bool {
	return !slices.Contains(c.MLPOnly, i) && c.Experts > 0 && (i+1)%c.SparseStep == 0
}

// KindOf names layer i's kind, sparse or dense as Sparse says (for Model.KindOf).
func (c QwenMoE) KindOf(sparse, dense string) func(i int) string {
	return func(i int) string {
		if c.Sparse(i) {
			return sparse
		}
		return dense
	}
}

// Block is a sparse layer's MLP: the router mlp.gate.weight [experts,
// hidden], then the stacked experts experts declares (gate and up [E,H,I],
// down [E,I,H], as StoredExperts.Declare gives them), run by strategy.
func (c QwenMoE) Block(strategy string, experts func(l *Layer) (gate, up, down fn.Value)) Block {
	return &qwenMoEBlock{QwenMoE: c, strategy: strategy, experts: experts}
}

// StoredBlock is Block over stored's experts, which can also run as ONNX
// Runtime's MoE op (blocks.Fused): with --target ort that is the form
// unless the export asks for another --moe-strategy.
func (c QwenMoE) StoredBlock(strategy string, stored *StoredExperts) Block {
	return &qwenMoEBlock{QwenMoE: c, strategy: strategy, experts: stored.Declare, fused: stored.DeclareFused}
}

type qwenMoEBlock struct {
	QwenMoE
	strategy string
	experts  func(l *Layer) (gate, up, down fn.Value)
	fused    func(l *Layer) (fc1, fc2 fn.Value) // nil: no MoE-op form
	router   blocks.Router
	run      blocks.Experts
	fc1, fc2 fn.Value // the MoE op's experts, when the strategy is Fused
}

func (b *qwenMoEBlock) Declare(l *Layer) {
	b.router = blocks.Router{Kind: blocks.SoftmaxTopK, Experts: b.Experts, TopK: b.TopK, Normalize: b.Normalize,
		Weight: l.Weight("mlp.gate.weight", int64(b.Experts), int64(l.Model.Hidden))}
	b.strategy = expertStrategy(l.Model, b.strategy, b.fused != nil)
	if b.strategy == blocks.Fused && b.fused != nil && l.Model.ORT() {
		b.fc1, b.fc2 = b.fused(l)
		return
	}
	b.run.Gate, b.run.Up, b.run.Down = b.experts(l)
}

// expertStrategy is the strategy the experts run by: the --moe-strategy
// the export gives, else with --target ort ONNX Runtime's MoE op where the
// block has that form (fusable), else the option's default (declared).
func expertStrategy(m *Model, declared string, fusable bool) string {
	if _, given := m.Export.GetPluginOptions()[MoEStrategy]; !given && fusable && m.ORT() {
		return blocks.Fused
	}
	return declared
}

// ORTUnmapped: in ONNX Runtime's form the experts run as ONNX Runtime's
// MoE op (blocks.ORTMoE) unless --moe-strategy says gather or dense
// (standard ops: each token's k experts' weights gathered, or every
// expert run), beside GroupQueryAttention.
func (b *qwenMoEBlock) ORTUnmapped(*Layer) string { return "" }

func (b *qwenMoEBlock) Apply(l *Layer, f *fn.Func, x fn.Value) (fn.Value, error) {
	if b.strategy != blocks.Fused {
		return RoutedExperts(f, x, l.Model.Hidden, b.router, "router", b.run, b.strategy)
	}
	if b.fc1 == "" {
		why := "the experts have no such form in this plugin"
		if !l.Model.ORT() {
			why = "export with --target ort"
		}
		return "", fmt.Errorf("%s %s is ONNX Runtime's MoE op: %s, or use %s or %s", MoEStrategy, blocks.Fused, why, blocks.Gather, blocks.Dense)
	}
	tokens := f.Reshape(x, -1, int64(l.Model.Hidden)) // [T,H]
	logits := blocks.Linear{Weight: b.router.Weight, ORT: true}.Apply(f.Scope("router"), tokens)
	y := blocks.ORTMoE(f.Scope("experts"), tokens, logits, b.fc1, b.fc2, b.TopK, b.Normalize)
	return f.Op("Reshape", []fn.Value{y, f.Shape(x)}), nil
}

// MoEStrategy names the plugin option every MoE plugin takes: how its
// experts run (blocks.Gather or blocks.Dense).
const MoEStrategy = "moe_strategy"

// MoEStrategyOption declares MoEStrategy (a fresh message each call).
func MoEStrategyOption() *pb.PluginOption {
	return &pb.PluginOption{Name: MoEStrategy, DefaultValue: blocks.Gather, AllowedValues: blocks.ExpertStrategies,
		Help: "gather: each token's k experts (decode-friendly); dense: every expert, weighed (static matmuls)"}
}

// FusedMoEStrategyOption is MoEStrategyOption for a plugin whose experts
// also run as ONNX Runtime's MoE op (QwenMoE.StoredBlock): fused, which
// --target ort picks unless told otherwise.
func FusedMoEStrategyOption() *pb.PluginOption {
	o := MoEStrategyOption()
	o.AllowedValues = append(slices.Clone(o.AllowedValues), blocks.Fused)
	o.Help += "; fused: ONNX Runtime's MoE op, each token's experts read in place (--target ort only, where it is the default)"
	return o
}
