package main

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

const (
	kindDecoder = "decoder" // qwen3_vl: every layer
	kindMoE     = "moe"     // qwen3_vl_moe: sparse layers
	kindDense   = "dense"   // qwen3_vl_moe: mlp_only_layers and decoder_sparse_step's gaps

	optStrategy  = "moe_strategy"
	optPositions = "position_ids_rank"
)

// positionsOption chooses the position_ids input of a text-only export:
// [batch, seq] (default: text has equal t/h/w rows, so plain RoPE) or
// [3, batch, seq] (MRoPE's rows, the vision model's input).
var positionsOption = &pb.PluginOption{Name: optPositions, DefaultValue: "2", AllowedValues: []string{"2", "3"},
	Help: "2: position_ids [batch, seq] (text: the t/h/w rows are equal); 3: [3, batch, seq], MRoPE's t/h/w rows (row 0 writes the cache)"}

// The language model lives under model.language_model. with its fields in
// text_config; lm_head.weight is top level, and so is the tie_word_embeddings
// transformers obeys.
var plugin = decoder.Plugin{Name: "qwen3vl", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "qwen3_vl", HFArchitectures: []string{"Qwen3VLForConditionalGeneration"}, Name: "Qwen3VL",
	ConfigObject: "text_config", Prefix: "model.language_model.",
	Capabilities: &pb.Capabilities{Layerwise: true, Models: []string{visionModel}},
	Options:      []*pb.PluginOption{positionsOption, visionOption},
	Load:         loadDense,
}, {
	ModelType: "qwen3_vl_moe", HFArchitectures: []string{"Qwen3VLMoeForConditionalGeneration"}, Name: "Qwen3VLMoe",
	ConfigObject: "text_config", Prefix: "model.language_model.",
	Capabilities: &pb.Capabilities{Layerwise: true, ExpertLayouts: []string{layoutHub.String(), layoutTransformers.String()},
		Models: []string{visionModel}},
	Options: []*pb.PluginOption{positionsOption, visionOption, {Name: optStrategy, DefaultValue: blocks.Gather, AllowedValues: blocks.ExpertStrategies,
		Help: "gather: each token's k experts (decode-friendly); dense: every expert, weighed (static matmuls)"}},
	Load: loadMoE,
}}}

// common reads what both model types share: the top-level
// tie_word_embeddings (text_config may carry a different, ignored value),
// the position_ids rank, the attention.
func common(m *decoder.Model) (*decoder.Attention, error) {
	decoder.RequireSiLU(m.Reader, "qwen3vl")
	bias := m.BoolOr("attention_bias", false)
	sliding := m.BoolOr("use_sliding_window", false)
	if m.Err != nil {
		return nil, m.Err
	}
	tied, err := m.Top.BoolOr("tie_word_embeddings", false)
	if err != nil {
		return nil, err
	}
	m.Tied = tied
	if sliding {
		return nil, fmt.Errorf("config.json: text_config.use_sliding_window is true; the qwen3vl plugin exports full attention only")
	}
	if len(m.RoPE.MRoPESection) != 3 {
		return nil, fmt.Errorf("config.json: text_config's rope parameters have no mrope_section; Qwen3-VL needs interleaved multimodal RoPE")
	}
	if m.Options[optPositions] == "3" {
		m.PositionIDsRank = 3
	}
	if m.Top.Has("vision_config") {
		if m.Options[optVision] != "true" {
			m.Note("model.onnx is the text-only language model (no vision inputs: --vision true adds them); the vision encoder is a model of its own: --extra-model vision")
		}
		addVision(m)
	}
	return &decoder.Attention{QKVBias: bias, OBias: bias, QKNorm: true}, nil
}

func loadDense(m *decoder.Model) error {
	attn, err := common(m)
	if err != nil {
		return err
	}
	k := m.Kind(kindDecoder, "Qwen3VLTextDecoderLayer", func(l *decoder.Layer) error {
		a := *attn
		return l.PreNorm(&a, &decoder.SwiGLU{Width: m.Intermediate})
	})
	return withVision(m, func(int) *decoder.Kind { return k })
}

// withVision adds the vision inputs when the vision option asks for them.
func withVision(m *decoder.Model, base func(i int) *decoder.Kind) error {
	if m.Options[optVision] != "true" {
		return nil
	}
	return addVisionInputs(m, base)
}

// moeConfig holds the MoE fields of a Qwen3-VL-MoE text_config. The router
// always renormalises its top-k weights (norm_topk_prob is not read by
// transformers' Qwen3VLMoeTextTopKRouter).
type moeConfig struct {
	experts, topK, moeIntermediate, sparseStep int
	mlpOnly                                    []int
	layouts                                    map[int32]expertLayout
}

func loadMoE(m *decoder.Model) error {
	attn, err := common(m)
	if err != nil {
		return err
	}
	c := moeConfig{
		experts: m.FirstInt("num_experts", "num_local_experts"), topK: m.Int("num_experts_per_tok"),
		moeIntermediate: m.Int("moe_intermediate_size"), sparseStep: m.IntOr("decoder_sparse_step", 1),
		mlpOnly: m.Ints("mlp_only_layers"),
	}
	if m.Err != nil {
		return m.Err
	}
	switch {
	case c.experts > 0 && (c.topK < 1 || c.topK > c.experts):
		return fmt.Errorf("config.json: text_config.num_experts_per_tok %d must be in 1..num_experts (%d)", c.topK, c.experts)
	case c.sparseStep < 1:
		return fmt.Errorf("config.json: text_config.decoder_sparse_step must be at least 1, got %d", c.sparseStep)
	case c.moeIntermediate <= 0:
		return fmt.Errorf("config.json: text_config.moe_intermediate_size must be positive, got %d", c.moeIntermediate)
	}
	m.KindOf = c.kind
	c.layouts = map[int32]expertLayout{}
	if err := m.EveryLayer(func(i int32) (err error) {
		c.layouts[i], err = c.detectLayout(m, i)
		return err
	}, kindMoE); err != nil {
		return err
	}
	sparse := m.Kind(kindMoE, "Qwen3VLMoeTextDecoderLayer", func(l *decoder.Layer) error {
		a := *attn
		return l.PreNorm(&a, &moe{moeConfig: c, strategy: m.Options[optStrategy]})
	})
	dense := m.Kind(kindDense, "Qwen3VLMoeTextDenseDecoderLayer", func(l *decoder.Layer) error {
		a := *attn
		return l.PreNorm(&a, &decoder.SwiGLU{Width: m.Intermediate})
	})
	return withVision(m, func(i int) *decoder.Kind {
		if c.kind(i) == kindMoE {
			return sparse
		}
		return dense
	})
}

// kind says whether layer i is sparse, as Qwen3VLMoeTextDecoderLayer decides.
func (c moeConfig) kind(i int) string {
	if !slices.Contains(c.mlpOnly, i) && c.experts > 0 && (i+1)%c.sparseStep == 0 {
		return kindMoE
	}
	return kindDense
}

// moe is the sparse MLP: softmax over all experts, top-k, renormalised;
// the chosen experts run by strategy.
type moe struct {
	moeConfig
	strategy string
	router   blocks.Router
	run      blocks.Experts
}

func (b *moe) Declare(l *decoder.Layer) {
	b.router = blocks.Router{Kind: blocks.SoftmaxTopK, Experts: b.experts, TopK: b.topK, Normalize: true,
		Weight: l.Weight("mlp.gate.weight", int64(b.experts), int64(l.Model.Hidden))}
	stacked := func(name string, part expertPart) fn.Value {
		return l.Computed(name, func(i int32) weight.Expr { return b.layouts[i].stacked(b.moeConfig, l.Model, i, part) })
	}
	b.run = blocks.Experts{Gate: stacked("mlp.experts.gate", gatePart), Up: stacked("mlp.experts.up", upPart),
		Down: stacked("mlp.experts.down", downPart)}
}

func (b *moe) Apply(l *decoder.Layer, f *fn.Func, x fn.Value) (fn.Value, error) {
	return decoder.RoutedExperts(f, x, l.Model.Hidden, b.router, "router", b.run, b.strategy)
}
