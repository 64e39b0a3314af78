package olmo2

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// tinyConfig is shaped like transformers 5's save of an Olmo2Config, with
// an explicit head_dim (hidden / heads is 16).
const tinyConfig = `{"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "hidden_size": 64,
	"intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
	"head_dim": 24, "vocab_size": 128, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": false,
	"max_position_embeddings": 128, "tie_word_embeddings": false, "attention_dropout": 0.0,
	"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}`

func TestRefusals(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"gelu": {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu" is not supported by the olmo2 plugin`},
		"partial rotary": {func(m map[string]any) { m["partial_rotary_factor"] = 0.5 },
			"partial_rotary_factor (rotary dimension 12 of head_dim 24) is not supported by the olmo2 plugin"},
		"partial rotary in rope_parameters": {func(m map[string]any) {
			m["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
		}, "partial_rotary_factor"},
		"unsupported rope": {func(m map[string]any) { m["rope_parameters"] = map[string]any{"rope_type": "dynamic", "factor": 2.0} },
			`rope type "dynamic" is not supported`},
		"kv not a divisor": {func(m map[string]any) { m["num_key_value_heads"] = 3 }, "multiple of num_key_value_heads (3)"},
		"huge layer count": {func(m map[string]any) { m["num_hidden_layers"] = 1000000000 }, "holds tensors for 2 layers"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tinyConfig, nil, "F32")
			model.ConfigJson = plugintest.Config(t, tinyConfig, tc.edit)
			if ok, reasons := plugintest.Check(t, plugin, model); ok || !strings.Contains(reasons, tc.want) {
				t.Errorf("supported=%v reasons=%q, want %q", ok, reasons, tc.want)
			}
		})
	}
}

// OLMo-2's layer binds post-norms and no pre-norm, q/k norms over all
// heads, and the o_proj bias with the others when attention_bias is set.
func TestBuildBindsEveryWeight(t *testing.T) {
	for _, bias := range []bool{false, true} {
		model := plugintest.Edited(t, plugin, tinyConfig, func(m map[string]any) { m["attention_bias"] = bias }, "F32")
		parts := plugintest.RequireBound(t, plugin, model,
			&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
			&pb.BuildRequest{Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0, 1}},
			&pb.BuildRequest{Part: sdk.PartFinal})
		layer := parts[2][1]
		for _, name := range []string{"post_attention_layernorm.weight", "post_feedforward_layernorm.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight"} {
			if got := layer[name]; !slices.Equal(got, []string{"model.layers.1." + name}) {
				t.Errorf("layer 1 %s bound to %v", name, got)
			}
		}
		if _, ok := layer["input_layernorm.weight"]; ok {
			t.Error("OLMo-2 has no input_layernorm, but the layer binds one")
		}
		for _, name := range []string{"self_attn.q_proj.bias", "self_attn.o_proj.bias"} {
			if _, ok := layer[name]; ok != bias {
				t.Errorf("attention_bias %v: %s bound: %v", bias, name, ok)
			}
		}
	}
	want, err := plugin.ExpectedTensors(plugintest.Edited(t, plugin, tinyConfig, nil, "F32"))
	if err != nil {
		t.Fatal(err)
	}
	shapes := map[string][]int64{}
	for _, e := range want {
		shapes[e.Key] = e.Shape
	}
	if q, k := shapes["model.layers.0.self_attn.q_norm.weight"], shapes["model.layers.0.self_attn.k_norm.weight"]; !slices.Equal(q, []int64{96}) || !slices.Equal(k, []int64{48}) {
		t.Errorf("q/k norms of shapes %v, %v; want heads×head_dim [96] and kv_heads×head_dim [48]", q, k)
	}
}

// rms_norm_eps absent is Olmo2Config's 1e-5 (the common decoder's default
// is 1e-6); present, it is read.
func TestNormEpsilon(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want float32
	}{
		"given":  {nil, 1e-6},
		"absent": {func(m map[string]any) { delete(m, "rms_norm_eps") }, 1e-5},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tinyConfig, tc.edit, "F32")
			for _, part := range []*pb.BuildRequest{{Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0}}, {Part: sdk.PartFinal}} {
				part.Model = model
				resp, err := plugin.Build(context.Background(), part)
				if err != nil {
					t.Fatal(err)
				}
				eps := epsilons(resp.GetFunction().GetNode())
				if len(eps) == 0 {
					t.Fatalf("%s: no RMSNorm", part.GetPart())
				}
				for _, e := range eps {
					if e != tc.want {
						t.Errorf("%s: an RMSNorm's epsilon is %g, want %g", part.GetPart(), e, tc.want)
					}
				}
			}
		})
	}
}

// epsilons are the epsilon attributes of the nodes (the RMSNorm calls).
func epsilons(nodes []*onnxpb.NodeProto) []float32 {
	var out []float32
	for _, n := range nodes {
		for _, a := range n.GetAttribute() {
			if a.GetName() == "epsilon" {
				out = append(out, a.GetF())
			}
		}
	}
	return out
}
