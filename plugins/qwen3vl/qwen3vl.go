package qwen3vl

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

const (
	kindDecoder = "decoder" // qwen3_vl: every layer
	kindMoE     = "moe"     // qwen3_vl_moe: sparse layers
	kindDense   = "dense"   // qwen3_vl_moe: mlp_only_layers and decoder_sparse_step's gaps

	optPositions = "position_ids_rank"
	optVision    = decoder.VisionOptionName
)

// qwenVision is Qwen3-VL's vision tower: the SDK's Qwen vision encoder with
// DeepStack.
var qwenVision = decoder.QwenVisionFamily{Plugin: "qwen3vl", Model: "Qwen3-VL", DeepStack: true}

var visionOption = decoder.QwenVisionOption(qwenVision)

// positionsOption chooses the position_ids input of a text-only export:
// [batch, seq] (default: text has equal t/h/w rows, so plain RoPE) or
// [3, batch, seq] (MRoPE's rows, the vision model's input).
var positionsOption = &pb.PluginOption{Name: optPositions, DefaultValue: "2", AllowedValues: []string{"2", "3"},
	Help: "2: position_ids [batch, seq] (text: the t/h/w rows are equal); 3: [3, batch, seq], MRoPE's t/h/w rows (row 0 writes the cache)"}

// The language model's fields are in text_config; lm_head.weight is top
// level, and so is the tie_word_embeddings transformers obeys. Its keys are
// under model.language_model. as transformers saves a
// Qwen3VL(Moe)ForConditionalGeneration, or in the other layouts it loads
// (lmPrefixes).
var plugin = decoder.Plugin{Name: "qwen3vl", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "qwen3_vl", HFArchitectures: []string{"Qwen3VLForConditionalGeneration"}, Name: "Qwen3VL",
	ConfigObject: "text_config", Prefixes: lmPrefixes,
	Capabilities: &pb.Capabilities{Layerwise: true, Models: []string{decoder.VisionModel}},
	Options:      []*pb.PluginOption{positionsOption, visionOption},
	// Qwen3VLTextConfig's, where they differ from the common decoder's.
	Defaults: map[string]any{"num_key_value_heads": 32, "head_dim": 128, "rope_theta": 5e5, "max_position_embeddings": 128000},
	Load:     loadDense,
}, {
	ModelType: "qwen3_vl_moe", HFArchitectures: []string{"Qwen3VLMoeForConditionalGeneration"}, Name: "Qwen3VLMoe",
	ConfigObject: "text_config", Prefixes: lmPrefixes,
	Capabilities: &pb.Capabilities{Layerwise: true, ExpertLayouts: []string{layoutHub.String(), layoutTransformers.String()},
		Models: []string{decoder.VisionModel}},
	Options: []*pb.PluginOption{positionsOption, visionOption, decoder.MoEStrategyOption()},
	// Qwen3VLMoeTextConfig's, where they differ from the common decoder's.
	Defaults: map[string]any{"num_key_value_heads": 16, "rope_theta": 5e5, "max_position_embeddings": 128000},
	Load:     loadMoE,
}}}

// lmPrefixes are the layouts of the language model's keys transformers
// loads for Qwen3-VL (probed with 5.24): model.language_model. as it saves
// them; language_model. as a Qwen3VLModel saves them (its loader adds the
// base model's model.); the doubled .model.model. of transformers
// 5.10–5.23 saves (its legacy renaming).
var lmPrefixes = []string{"model.language_model.", "language_model.", "model.language_model.model.", "language_model.model.model."}

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
	if m.RoPE.MRoPESection == nil { // modeling_qwen3_vl's when the rope parameters have none
		if err := m.RoPE.SetMRoPE([]int{24, 20, 20}); err != nil {
			return nil, err
		}
	}
	if m.Options[optPositions] == "3" {
		m.PositionIDsRank = 3
	}
	if m.Top.Has("vision_config") {
		if m.Options[optVision] != "true" {
			m.Note("model.onnx is the text-only language model (no vision inputs: --vision true adds them); the vision encoder is a model of its own: --extra-model vision")
		}
		decoder.AddQwenVision(m, qwenVision)
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
	return decoder.AddQwenVisionInputs(m, qwenVision, base)
}

// loadMoE loads qwen3_vl_moe: Qwen's sparse MoE whose router always
// renormalises its top-k weights (norm_topk_prob is not read by
// transformers' Qwen3VLMoeTextTopKRouter), experts fused in either
// orientation (experts.go).
func loadMoE(m *decoder.Model) error {
	attn, err := common(m)
	if err != nil {
		return err
	}
	c := decoder.ReadQwenMoE(m)
	c.Normalize = true
	if m.Err != nil {
		return m.Err
	}
	if err := c.Check(m); err != nil {
		return err
	}
	m.KindOf = c.KindOf(kindMoE, kindDense)
	layouts := map[int32]expertLayout{}
	if err := m.EveryLayer(func(i int32) (err error) {
		layouts[i], err = detectLayout(c, m, i)
		return err
	}, kindMoE); err != nil {
		return err
	}
	experts := func(l *decoder.Layer) (gate, up, down fn.Value) {
		stacked := func(name string, part expertPart) fn.Value {
			return l.Computed(name, func(i int32) weight.Expr { return layouts[i].stacked(c, l.Model, i, part) })
		}
		return stacked("mlp.experts.gate", gatePart), stacked("mlp.experts.up", upPart), stacked("mlp.experts.down", downPart)
	}
	sparse := m.Kind(kindMoE, "Qwen3VLMoeTextDecoderLayer", func(l *decoder.Layer) error {
		a := *attn
		return l.PreNorm(&a, c.Block(m.Options[decoder.MoEStrategy], experts))
	})
	dense := m.Kind(kindDense, "Qwen3VLMoeTextDenseDecoderLayer", func(l *decoder.Layer) error {
		a := *attn
		return l.PreNorm(&a, &decoder.SwiGLU{Width: m.Intermediate})
	})
	return withVision(m, func(i int) *decoder.Kind {
		if c.Sparse(i) {
			return sparse
		}
		return dense
	})
}
