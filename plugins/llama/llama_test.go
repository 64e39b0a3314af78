package llama

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const tinyConfig = `{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
	"num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 128, "rms_norm_eps": 1e-5}`

// tinyModel is a config with the inventory it implies, edited by edit.
func tinyModel(t *testing.T, edit func(map[string]any)) *pb.Model {
	t.Helper()
	return plugintest.Edited(t, plugin, tinyConfig, edit, "BF16")
}

func TestConfigErrors(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"missing hidden_size": {func(m map[string]any) { delete(m, "hidden_size") }, `"hidden_size" is missing`},
		"missing vocab":       {func(m map[string]any) { delete(m, "vocab_size") }, `"vocab_size" is missing`},
		"gelu":                {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu" is not supported`},
		"heads not a multiple": {func(m map[string]any) { m["num_key_value_heads"] = 3 },
			"must be a multiple of num_key_value_heads (3)"},
		"zero layers":     {func(m map[string]any) { m["num_hidden_layers"] = 0 }, "must be positive"},
		"bad rope":        {func(m map[string]any) { m["rope_scaling"] = map[string]any{"rope_type": "yarnish"} }, `rope type "yarnish"`},
		"string for bool": {func(m map[string]any) { m["attention_bias"] = "no" }, `"attention_bias" must be true or false`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			resp, err := plugin.Check(context.Background(), &pb.CheckRequest{Model: tinyModel(t, tc.edit)})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetSupported() || !strings.Contains(strings.Join(resp.GetReasons(), ";"), tc.want) {
				t.Errorf("supported=%v reasons=%v, want unsupported because %q", resp.GetSupported(), resp.GetReasons(), tc.want)
			}
		})
	}
}

func TestMissingOrMisshapenTensors(t *testing.T) {
	model := tinyModel(t, nil)
	model.Tensors = model.Tensors[1:] // drop one
	model.Tensors[0].Shape = []int64{1, 2}
	resp, _ := plugin.Check(context.Background(), &pb.CheckRequest{Model: model})
	reasons := strings.Join(resp.GetReasons(), ";")
	if resp.GetSupported() || !strings.Contains(reasons, "missing from the checkpoint") || !strings.Contains(reasons, "has shape [1 2]") {
		t.Errorf("reasons %q", reasons)
	}
}

// Every formal input of every part is a role the host binds or a weight
// bound to a tensor the checkpoint holds; the tied head reads the embedding.
func TestBuildBindsEveryWeight(t *testing.T) {
	for _, tied := range []bool{false, true} {
		t.Run(fmt.Sprint("tied=", tied), func(t *testing.T) {
			model := tinyModel(t, func(m map[string]any) { m["tie_word_embeddings"] = tied; m["attention_bias"] = true })
			parts := plugintest.RequireBound(t, plugin, model,
				&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0, 1}},
				&pb.BuildRequest{Part: sdk.PartFinal})
			head := parts[3][sdk.NonLayer]["lm_head.weight"]
			if tied != slices.Equal(head, []string{"model.embed_tokens.weight"}) {
				t.Errorf("tied=%v but lm_head bound to %v", tied, head)
			}
			if len(parts[2]) != 2 {
				t.Errorf("layer bindings for %d layers, want 2", len(parts[2]))
			}
		})
	}
}

func TestPlan(t *testing.T) {
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: tinyModel(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.GetLayers()) != 2 || plan.GetVocabSize() != 128 || len(plan.GetKinds()) != 1 {
		t.Fatalf("plan %v", plan)
	}
	shape := plan.GetKinds()[0].GetCaches()[0].GetShape()
	if shape[1].GetSize() != 2 || shape[2].GetParam() != "ctx_len" || shape[3].GetSize() != 8 {
		t.Errorf("cache shape %v, want [batch_size, 2, ctx_len, 8]", shape)
	}
}
