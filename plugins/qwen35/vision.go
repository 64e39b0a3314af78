package qwen35

import "github.com/strata-llm/strata/sdk/decoder"

// Vision for the natively multimodal releases (qwen3_5, qwen3_5_moe), through
// the SDK's Qwen vision encoder and vision inputs, which Qwen3-VL shares.
// What differs from Qwen3-VL, as transformers' Qwen3_5Model computes it:
// the vision tower has no DeepStack (no deepstack_merger_list, vision.onnx
// outputs vision_embeds only, model.onnx takes no deepstack_features), and
// the text model's MRoPE turns only the partial rotary width (0.25 of
// head_dim) with the sections [11, 11, 10] when the rope parameters give
// none. The placement at image_token_id tokens, get_rope_index's rows and
// position_ids [4, batch, seq] are Qwen3-VL's. Videos are not implemented
// (as for Qwen3-VL).

// qwenVision is Qwen3.5's vision tower: Qwen3-VL's without DeepStack.
var qwenVision = decoder.QwenVisionFamily{Plugin: "qwen35", Model: "Qwen3.5", DeepStack: false}

// qwen35MRoPE is Qwen3_5TextRotaryEmbedding's mrope_section when the rope
// parameters have none.
var qwen35MRoPE = []int{11, 11, 10}

// multimodalOptions adds the vision model and the vision option to a
// multimodal architecture.
func multimodalOptions(a *decoder.Architecture) {
	a.Capabilities.Models = []string{decoder.VisionModel}
	a.Options = append(a.Options, decoder.QwenVisionOption(qwenVision))
}

// addVision declares vision.onnx when the checkpoint holds a vision tower
// the SDK's encoder computes (Check notes why not otherwise).
func addVision(m *decoder.Model) {
	if !m.Top.Has("vision_config") {
		return
	}
	if m.Options[decoder.VisionOptionName] != "true" {
		m.Note("model.onnx is the text-only language model (no vision inputs: --vision true adds them); the vision encoder is a model of its own: --extra-model vision")
	}
	decoder.AddQwenVision(m, qwenVision)
}

// withVision makes model.onnx take vision_embeds and position_ids
// [4, batch, seq] when the vision option asks for them.
func withVision(m *decoder.Model) error {
	if m.Options[decoder.VisionOptionName] != "true" {
		return nil
	}
	if m.RoPE.MRoPESection == nil {
		if err := m.RoPE.SetMRoPE(qwen35MRoPE); err != nil {
			return err
		}
	}
	return decoder.AddQwenVisionInputs(m, qwenVision, nil) // no DeepStack: no kind of its own
}
