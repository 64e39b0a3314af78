package qwen35

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/hf"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const visionConfig = `{"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
	"temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 64, "num_position_embeddings": 16,
	"in_channels": 3, "hidden_act": "gelu_pytorch_tanh", "model_type": "qwen3_5_vision"}`

// multimodal is a qwen3_5 checkpoint (text_config, the language model under
// model.language_model., the vision tower under model.visual.), its
// vision_config edited by edit.
func multimodal(t *testing.T, edit func(v map[string]any)) *pb.Model {
	t.Helper()
	var text, vision map[string]any
	if err := json.Unmarshal([]byte(denseConfig), &text); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(visionConfig), &vision); err != nil {
		t.Fatal(err)
	}
	text["model_type"] = "qwen3_5_text"
	top := map[string]any{"model_type": "qwen3_5", "architectures": []string{"Qwen3_5ForConditionalGeneration"},
		"text_config": text, "vision_config": vision, "image_token_id": 120, "tie_word_embeddings": false}
	data, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	model := plugintest.Model(t, plugin, data, "F32")
	cfg, err := hf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	tower, err := decoder.ReadQwenVision(cfg, 64, qwenVision)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range tower.Tensors() {
		model.Tensors = append(model.Tensors, &pb.TensorInfo{Key: decoder.VisionPrefix + ts[0].(string), Dtype: "F32", Shape: ts[1].([]int64)})
	}
	if edit != nil {
		model.ConfigJson = plugintest.Config(t, string(data), func(top map[string]any) { edit(top["vision_config"].(map[string]any)) })
	}
	return model
}

var visionOn = &pb.ExportOptions{PluginOptions: map[string]string{decoder.VisionOptionName: "true"}}

// With --vision true, model.onnx takes input_ids, vision_embeds (no
// DeepStack: no deepstack_features, no context values for it) and
// position_ids [4, batch, seq]; vision.onnx outputs vision_embeds only.
func TestVisionInputsWithoutDeepStack(t *testing.T) {
	model := multimodal(t, nil)
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: visionOn})
	if err != nil {
		t.Fatal(err)
	}
	var extra []string
	for _, in := range plan.GetExtraInputs() {
		extra = append(extra, in.GetName())
	}
	switch {
	case !slices.Equal(extra, []string{sdk.InputIDs, decoder.VisionEmbeds}):
		t.Errorf("extra inputs %v", extra)
	case plan.GetPositionIdsRank() != 3 || plan.GetPositionRows() != 4:
		t.Errorf("position_ids rank %d rows %d, want 3 and 4", plan.GetPositionIdsRank(), plan.GetPositionRows())
	case slices.Contains(plan.GetContextOutputs(), decoder.CtxVisionIndex):
		t.Errorf("context outputs %v: no DeepStack, no vision index", plan.GetContextOutputs())
	case len(plan.GetModels()) != 1 || plan.GetModels()[0].GetName() != decoder.VisionModel:
		t.Fatalf("models %v", plan.GetModels())
	}
	var outs []string
	for _, o := range plan.GetModels()[0].GetOutputs() {
		outs = append(outs, o.GetName())
	}
	if !slices.Equal(outs, []string{decoder.VisionEmbeds}) {
		t.Errorf("vision outputs %v", outs)
	}
	resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartModel, ModelName: decoder.VisionModel})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetFunction().GetOutput(); !slices.Equal(got, []string{decoder.VisionEmbeds}) {
		t.Errorf("vision.onnx outputs %v", got)
	}
	// The linear layer (no KV cache) picks row 0 of position_ids itself, so a
	// window of linear layers needs no context part.
	layer, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartLayer, Kind: "linear_dense", Layers: []int32{0}, Options: visionOn})
	if err != nil {
		t.Fatal(err)
	}
	if in := layer.GetFunction().GetInput(); !slices.Contains(in, sdk.PositionIDs) || slices.Contains(in, decoder.CtxPositions) {
		t.Errorf("linear layer inputs %v", in)
	}
}

// DeepStack indexes (Qwen3-VL's) are refused for Qwen3.5's tower, which
// has no DeepStack mergers: the vision model is not offered, the language
// model still exports, and --vision true says why.
func TestVisionRefusesDeepStack(t *testing.T) {
	empty := multimodal(t, func(v map[string]any) { v["deepstack_visual_indexes"] = []int{} })
	if plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: empty}); err != nil || len(plan.GetModels()) != 1 {
		t.Errorf("an empty deepstack_visual_indexes: models %v, %v", plan.GetModels(), err)
	}
	model := multimodal(t, func(v map[string]any) { v["deepstack_visual_indexes"] = []int{0} })
	ok, reasons := plugintest.Check(t, plugin, model)
	if !ok || !strings.Contains(reasons, "has no DeepStack mergers") {
		t.Errorf("supported=%v reasons %q", ok, reasons)
	}
	if _, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: visionOn}); err == nil || !strings.Contains(err.Error(), "no DeepStack mergers") {
		t.Errorf("--vision true: %v", err)
	}
}

// The MTP draft with vision inputs is refused by name: its positions would
// be the image's MRoPE rows, which the draft does not take.
func TestVisionWithDraftRefused(t *testing.T) {
	model := withMTP(multimodal(t, nil), 3, 0)
	opts := &pb.ExportOptions{PluginOptions: map[string]string{decoder.VisionOptionName: "true", decoder.MTPOptionName: decoder.MTPDraft}}
	_, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: opts})
	if err == nil || !strings.Contains(err.Error(), "--mtp draft with --vision true is not implemented") {
		t.Fatalf("plan with --vision true --mtp draft: %v, want the combination refused", err)
	}
	if _, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: visionOn}); err != nil {
		t.Fatalf("plan with --vision true alone: %v", err)
	}
}
