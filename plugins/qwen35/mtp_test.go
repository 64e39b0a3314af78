package qwen35

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

var draftOpts = &pb.ExportOptions{PluginOptions: map[string]string{decoder.MTPOptionName: decoder.MTPDraft}}

// withMTP adds an MTP layer to model as the releases store it: mtp.layers.0
// a copy of the attention of full layer attn and the MLP of layer mlp, and
// mtp.fc, the pre-fc norms and mtp.norm.
func withMTP(model *pb.Model, attn, mlp int) *pb.Model {
	from := func(k string, layer int, part string) (string, bool) {
		p := "model.layers." + string(rune('0'+layer)) + "."
		rest, ok := strings.CutPrefix(k, p)
		return "mtp.layers.0." + rest, ok && strings.HasPrefix(rest, part)
	}
	var add []*pb.TensorInfo
	for _, t := range model.Tensors {
		for _, src := range []struct {
			layer int
			part  string
		}{{attn, "self_attn."}, {attn, "input_layernorm"}, {attn, "post_attention_layernorm"}, {mlp, "mlp."}} {
			if k, ok := from(t.GetKey(), src.layer, src.part); ok {
				add = append(add, &pb.TensorInfo{Key: k, Shape: t.GetShape(), Dtype: t.GetDtype()})
			}
		}
	}
	for _, k := range []string{"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"} {
		add = append(add, &pb.TensorInfo{Key: k, Shape: []int64{64}, Dtype: "F32"})
	}
	add = append(add, &pb.TensorInfo{Key: "mtp.fc.weight", Shape: []int64{64, 128}, Dtype: "F32"})
	model.Tensors = append(model.Tensors, add...)
	return model
}

// --mtp draft: model.onnx also returns hidden_states, mtp.onnx is written
// by default and binds the mtp.* tensors (its layer through mtp.layers.0.,
// cache past_key.{num_hidden_layers}) and the main embedding and head.
func TestMTPDraft(t *testing.T) {
	model := withMTP(plugintest.Edited(t, plugin, denseConfig, func(c map[string]any) { c["mtp_num_hidden_layers"] = 1 }, "F32"), 2, 2)
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: draftOpts})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.GetExtraOutputs()) != 1 || plan.GetExtraOutputs()[0].GetName() != sdk.HiddenStates {
		t.Errorf("extra outputs %v, want hidden_states", plan.GetExtraOutputs())
	}
	if ms := plan.GetModels(); len(ms) != 1 || ms[0].GetName() != decoder.ModelMTP || !ms[0].GetByDefault() {
		t.Errorf("models %v, want mtp written by default", ms)
	}
	bound := plugintest.DraftBound(t, plugin, model, draftOpts, decoder.ModelMTP,
		sdk.InputIDs, sdk.PositionIDs, sdk.HiddenStates, "past_key.4", "past_value.4")
	want := map[string]string{"mtp.fc.weight": "mtp.fc.weight", "mtp.norm.weight": "mtp.norm.weight",
		"self_attn.q_proj.weight": "mtp.layers.0.self_attn.q_proj.weight", "mlp.gate_proj.weight": "mtp.layers.0.mlp.gate_proj.weight",
		"embed_tokens.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight"}
	for in, key := range want {
		if !slices.Equal(bound[in], []string{key}) {
			t.Errorf("%s reads %v, want %s", in, bound[in], key)
		}
	}
}

// A MoE MTP layer where the decoder has no full MoE layer: its kind is a
// side kind (not in the plan) and the draft reads its experts.
func TestMTPDraftSideKind(t *testing.T) {
	seeds := []*pb.TensorInfo{{Key: "model.layers.0." + decoder.ExpertName(0, "gate_proj")}, {Key: "model.layers.0." + decoder.ExpertName(3, "gate_proj")}}
	model := withMTP(plugintest.Edited(t, plugin, nextConfig, nil, "F32", seeds...), 1, 0)
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: draftOpts})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range plan.GetKinds() {
		if k.GetName() == "full_moe" {
			t.Errorf("the plan lists the MTP layer's kind full_moe, which no decoder layer has")
		}
	}
	bound := plugintest.DraftBound(t, plugin, model, draftOpts, decoder.ModelMTP,
		sdk.InputIDs, sdk.PositionIDs, sdk.HiddenStates, "past_key.2", "past_value.2")
	if got := bound["mlp.experts.down"]; len(got) != 4 || got[3] != "mtp.layers.0."+decoder.ExpertName(3, "down_proj") {
		t.Errorf("draft experts read %v", got)
	}
}

func TestMTPRefusals(t *testing.T) {
	dense := func(t *testing.T) *pb.Model { return plugintest.Edited(t, plugin, denseConfig, nil, "F32") }
	cases := map[string]struct {
		model func(t *testing.T) *pb.Model
		want  string
	}{
		"no mtp tensors": {dense, "--mtp draft: the checkpoint holds no mtp.* tensor"},
		"dedicated embeddings": {func(t *testing.T) *pb.Model {
			m := withMTP(dense(t), 2, 2)
			m.ConfigJson = plugintest.Config(t, denseConfig, func(c map[string]any) { c["mtp_use_dedicated_embeddings"] = true })
			return m
		}, "mtp_use_dedicated_embeddings is not false"},
		"fc missing": {func(t *testing.T) *pb.Model {
			m := withMTP(dense(t), 2, 2)
			m.Tensors = slices.DeleteFunc(m.Tensors, func(x *pb.TensorInfo) bool { return x.GetKey() == "mtp.fc.weight" })
			return m
		}, "mtp.fc.weight"},
		"no mlp": {func(t *testing.T) *pb.Model {
			m := withMTP(dense(t), 2, 2)
			m.Tensors = slices.DeleteFunc(m.Tensors, func(x *pb.TensorInfo) bool { return strings.HasPrefix(x.GetKey(), "mtp.layers.0.mlp.") })
			return m
		}, "cannot tell the MTP layer's MLP"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: tc.model(t), Options: draftOpts})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestDraftNeedsTheOption(t *testing.T) {
	model := withMTP(plugintest.Edited(t, plugin, denseConfig, nil, "F32"), 2, 2)
	_, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartModel, ModelName: decoder.ModelMTP})
	if err == nil || !strings.Contains(err.Error(), "needs --mtp draft") {
		t.Errorf("error %v, want one naming --mtp draft", err)
	}
}
