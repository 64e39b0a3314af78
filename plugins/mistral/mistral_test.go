package mistral

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// tinyConfig is shaped like transformers 5's save of a MistralConfig.
const tinyConfig = `{"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 64,
	"intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
	"head_dim": 16, "vocab_size": 128, "rms_norm_eps": 1e-5, "sliding_window": 4, "hidden_act": "silu",
	"max_position_embeddings": 128, "tie_word_embeddings": false, "attention_dropout": 0.0,
	"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}`

func check(t *testing.T, m *pb.Model) (bool, string) { return plugintest.Check(t, plugin, m) }

func TestRefusals(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"gelu":            {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu" is not supported by the mistral plugin`},
		"zero window":     {func(m map[string]any) { m["sliding_window"] = 0 }, "sliding_window must be positive (or null for full attention), got 0"},
		"negative window": {func(m map[string]any) { m["sliding_window"] = -4 }, "sliding_window must be positive"},
		"string window":   {func(m map[string]any) { m["sliding_window"] = "4" }, `"sliding_window" must be an integer`},
		"partial rotary": {func(m map[string]any) { m["partial_rotary_factor"] = 0.5 },
			"partial_rotary_factor (rotary dimension 8 of head_dim 16) is not supported by the mistral plugin"},
		"partial rotary in rope_parameters": {func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
		}, "partial_rotary_factor"},
		"per-layer overrides": {func(m map[string]any) { m["per_layer_config"] = map[string]any{"1": map[string]any{}} },
			"per_layer_config (per-layer overrides) is not supported"},
		"mixed layer_types": {func(m map[string]any) { m["layer_types"] = []string{"sliding_attention", "full_attention"} },
			`layer_types mixes "sliding_attention" and "full_attention": transformers' MistralModel applies sliding_window to every layer alike`},
		"unknown layer type": {func(m map[string]any) { m["layer_types"] = []string{"chunked_attention", "chunked_attention"} },
			`layer_types[0] is "chunked_attention"`},
		"default kv heads": {func(m map[string]any) { delete(m, "num_key_value_heads"); m["num_attention_heads"] = 4 },
			"num_attention_heads (4) must be a multiple of num_key_value_heads (8) (config.json omits num_key_value_heads: model_type mistral's default is 8"},
		"unsupported rope": {func(m map[string]any) { m["rope_parameters"] = map[string]any{"rope_type": "dynamic", "factor": 2.0} },
			`rope type "dynamic" is not supported`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tinyConfig, nil, "F32")
			model.ConfigJson = plugintest.Config(t, tinyConfig, tc.edit)
			if ok, reasons := check(t, model); ok || !strings.Contains(reasons, tc.want) {
				t.Errorf("supported=%v reasons=%q, want %q", ok, reasons, tc.want)
			}
		})
	}
}

// The window as transformers reads sliding_window: a number slides every
// layer, null is full attention, absent is MistralConfig's default 4096.
// A uniform layer_types changes nothing (MistralModel does not read it).
func TestSlidingWindow(t *testing.T) {
	cases := map[string]struct {
		edit   func(map[string]any)
		window string // "" for full attention
	}{
		"set":                   {nil, "4"},
		"null":                  {func(m map[string]any) { m["sliding_window"] = nil }, ""},
		"absent":                {func(m map[string]any) { delete(m, "sliding_window") }, "4096"},
		"layer_types all full":  {func(m map[string]any) { m["layer_types"] = []string{"full_attention", "full_attention"} }, "4"},
		"layer_types all slide": {func(m map[string]any) { m["layer_types"] = []string{"sliding_attention", "sliding_attention"} }, "4"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tinyConfig, tc.edit, "BF16")
			ok, reasons := check(t, model)
			if !ok {
				t.Fatalf("refused: %s", reasons)
			}
			plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model})
			if err != nil {
				t.Fatal(err)
			}
			sliding := slices.Contains(plan.GetContextOutputs(), decoder.SlidingMask)
			layer, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0, 1}})
			if err != nil {
				t.Fatal(err)
			}
			reads := slices.Contains(layer.GetFunction().GetInput(), decoder.SlidingMask)
			if want := tc.window != ""; sliding != want || reads != want {
				t.Errorf("context value %v, layer input %v; want sliding %v", sliding, reads, want)
			}
			if note := fmt.Sprintf("masked to the last %s positions", tc.window); tc.window != "" && !strings.Contains(reasons, note) {
				t.Errorf("notes %q lack %q", reasons, note)
			}
			if len(plan.GetKinds()) != 1 || layer.GetFunction().GetName() != "MistralDecoderLayer" {
				t.Errorf("kinds %v, function %s", plan.GetKinds(), layer.GetFunction().GetName())
			}
		})
	}
}

// num_key_value_heads: MistralConfig's 8 when absent, the heads when null.
func TestKVHeadsDefault(t *testing.T) {
	for _, tc := range []struct {
		value any
		want  int64
	}{{nil, 16}, {"absent", 8}, {4, 4}} {
		edit := func(m map[string]any) {
			m["num_attention_heads"], m["head_dim"] = 16, 8
			if m["num_key_value_heads"] = tc.value; tc.value == "absent" {
				delete(m, "num_key_value_heads")
			}
		}
		model := plugintest.Edited(t, plugin, tinyConfig, edit, "F32")
		plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model})
		if err != nil {
			t.Fatal(err)
		}
		if got := plan.GetKinds()[0].GetCaches()[0].GetShape()[1].GetSize(); got != tc.want {
			t.Errorf("num_key_value_heads %v: cache heads %d, want %d", tc.value, got, tc.want)
		}
	}
}

// Every formal input is bound; no bias is (MistralAttention and MistralMLP
// have none, and transformers ignores attention_bias / mlp_bias in a
// mistral config); the tied head reads the embedding.
func TestBuildBindsEveryWeight(t *testing.T) {
	for _, tied := range []bool{false, true} {
		t.Run(fmt.Sprint("tied=", tied), func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tinyConfig, func(m map[string]any) {
				m["tie_word_embeddings"], m["attention_bias"], m["mlp_bias"] = tied, true, true
			}, "BF16")
			parts := plugintest.RequireBound(t, plugin, model,
				&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
				&pb.BuildRequest{Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0, 1}},
				&pb.BuildRequest{Part: sdk.PartFinal})
			if head := parts[3][sdk.NonLayer]["lm_head.weight"]; tied != slices.Equal(head, []string{"model.embed_tokens.weight"}) {
				t.Errorf("tied=%v but lm_head bound to %v", tied, head)
			}
			for input := range parts[2][1] {
				if strings.HasSuffix(input, ".bias") {
					t.Errorf("layer 1 binds %s", input)
				}
			}
			if got := parts[2][1]["self_attn.k_proj.weight"]; len(got) != 1 || got[0] != "model.layers.1.self_attn.k_proj.weight" {
				t.Errorf("layer 1 k_proj bound to %v", got)
			}
		})
	}
}

func TestMissingTensor(t *testing.T) {
	model := plugintest.Edited(t, plugin, tinyConfig, nil, "F32")
	model.Tensors = slices.DeleteFunc(model.Tensors, func(ti *pb.TensorInfo) bool {
		return ti.Key == "model.layers.1.self_attn.v_proj.weight"
	})
	if ok, reasons := check(t, model); ok || !strings.Contains(reasons, "model.layers.1.self_attn.v_proj.weight") {
		t.Errorf("supported=%v reasons=%q", ok, reasons)
	}
}
