package phi3

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// tinyConfig is shaped like transformers 5's save of a Phi3Config with
// Phi-4-mini's partial rotary (0.75 of head_dim 16: 6 frequencies) and
// longrope.
const tinyConfig = `{"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 64,
	"intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
	"vocab_size": 128, "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 128,
	"original_max_position_embeddings": 32, "sliding_window": null, "tie_word_embeddings": false,
	"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
		"original_max_position_embeddings": 32, "short_factor": [1, 1, 1, 1.5, 2, 2.5], "long_factor": [1, 2, 4, 8, 16, 32]}}`

func TestRefusals(t *testing.T) {
	longrope := func(m map[string]any) map[string]any { return m["rope_parameters"].(map[string]any) }
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"gelu": {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu" is not supported by the phi3 plugin`},
		"yarn": {func(m map[string]any) { longrope(m)["rope_type"] = "yarn"; longrope(m)["factor"] = 4.0 },
			`rope type "yarn" is not supported by the phi3 plugin: transformers' Phi3Config accepts default and longrope (and renames su and yarn to longrope)`},
		"linear": {func(m map[string]any) { m["rope_parameters"] = map[string]any{"rope_type": "linear", "factor": 2.0} },
			`rope type "linear" is not supported by the phi3 plugin`},
		"su": {func(m map[string]any) { longrope(m)["rope_type"] = "su" }, `rope type "su" is not supported`},
		"rope_scaling and rope_parameters": {func(m map[string]any) { m["rope_scaling"] = map[string]any{"rope_type": "default"} },
			"rope_scaling next to rope_parameters is not supported by the phi3 plugin"},
		"explicit head_dim with longrope": {func(m map[string]any) {
			m["head_dim"] = 32
			longrope(m)["partial_rotary_factor"] = 0.375 // 12 rotated of 32: six factors, as of 16 × 0.75
		}, "head_dim 32 ≠ hidden_size / num_attention_heads (16) with longrope is not supported by the phi3 plugin"},
		"factor count": {func(m map[string]any) { longrope(m)["short_factor"] = []float64{1, 2} },
			"rope_parameters.short_factor has 2 entries; longrope needs one per rotated frequency (rotary dimension 12 / 2 = 6)"},
		"zero window": {func(m map[string]any) { m["sliding_window"] = 0 }, "sliding_window must be positive (or null for full attention), got 0"},
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

// The fused projections are what the checkpoint must hold, and q/k/v and
// gate/up are bound to row slices of them: q rows [0, 64), k [64, 96),
// v [96, 128) of qkv_proj [128, 64]; gate [0, 96), up [96, 192) of
// gate_up_proj [192, 64].
func TestFusedProjectionsBindRowSlices(t *testing.T) {
	model := plugintest.Edited(t, plugin, tinyConfig, nil, "F32")
	want, err := plugin.ExpectedTensors(model)
	if err != nil {
		t.Fatal(err)
	}
	shapes := map[string][]int64{}
	for _, e := range want {
		shapes[e.Key] = e.Shape
	}
	for key, shape := range map[string][]int64{"model.layers.1.self_attn.qkv_proj.weight": {128, 64},
		"model.layers.1.mlp.gate_up_proj.weight": {192, 64}, "model.layers.1.self_attn.o_proj.weight": {64, 64},
		"model.layers.1.mlp.down_proj.weight": {64, 96}} {
		if !slices.Equal(shapes[key], shape) {
			t.Errorf("expected %s of shape %v, got %v", key, shape, shapes[key])
		}
	}
	for key := range shapes {
		if strings.Contains(key, "q_proj") || strings.Contains(key, "gate_proj") {
			t.Errorf("expects separate projection %s", key)
		}
	}
	parts := plugintest.RequireBound(t, plugin, model,
		&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0, 1}},
		&pb.BuildRequest{Part: sdk.PartFinal})
	layer := parts[2][1]
	for input, key := range map[string]string{"self_attn.q_proj.weight": "self_attn.qkv_proj.weight",
		"self_attn.v_proj.weight": "self_attn.qkv_proj.weight", "mlp.up_proj.weight": "mlp.gate_up_proj.weight"} {
		if got := layer[input]; !slices.Equal(got, []string{"model.layers.1." + key}) {
			t.Errorf("layer 1 %s bound to %v, want a slice of %s", input, got, key)
		}
	}
	resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0}})
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][2]int64{"self_attn.q_proj.weight": {0, 64}, "self_attn.k_proj.weight": {64, 96},
		"self_attn.v_proj.weight": {96, 128}, "mlp.gate_proj.weight": {0, 96}, "mlp.up_proj.weight": {96, 192}}
	for _, b := range resp.GetWeights()[0].GetBindings() {
		r, ok := rows[b.GetInput()]
		if !ok {
			continue
		}
		w := b.GetWeight()
		if w.GetOp() != "slice" || w.GetAxis() != 0 || w.GetStep() != 1 || w.GetStart() != r[0] || w.GetEnd() != r[1] {
			t.Errorf("%s bound to %v, want rows [%d, %d) on axis 0", b.GetInput(), w, r[0], r[1])
		}
		delete(rows, b.GetInput())
	}
	if len(rows) != 0 {
		t.Errorf("unbound: %v", rows)
	}
}

// Fusion changes the bindings only: the layer graph is the one separate
// q/k/v and gate/up projections give.
func TestFusedGraphIsTheSeparateGraph(t *testing.T) {
	separate := decoder.Plugin{Name: "phi3", Version: "0.1.0", Architectures: []decoder.Architecture{{
		ModelType: "phi3", HFArchitectures: []string{"Phi3ForCausalLM"}, Name: "Phi3", Load: func(m *decoder.Model) error {
			m.Kind("decoder", "Phi3DecoderLayer", func(l *decoder.Layer) error {
				return l.PreNorm(&decoder.Attention{}, &decoder.SwiGLU{Width: m.Intermediate})
			})
			return nil
		},
	}}}
	model := plugintest.Edited(t, plugin, tinyConfig, nil, "F32")
	build := func(p decoder.Plugin) *pb.BuildResponse {
		resp, err := p.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if fused, sep := build(plugin), build(separate); !proto.Equal(fused.GetFunction(), sep.GetFunction()) {
		t.Error("the fused layer's graph differs from the separate projections'")
	}
}

// longrope's tables switch per call in the context part (ReduceMax over
// position_ids, Where between the tables); default rope has no switch.
func TestLongRoPESwitchInContext(t *testing.T) {
	for _, tc := range []struct {
		edit    func(map[string]any)
		switch_ bool
	}{{nil, true}, {func(m map[string]any) {
		m["rope_parameters"] = map[string]any{"rope_type": "default", "rope_theta": 10000.0}
	}, false}} {
		model := plugintest.Edited(t, plugin, tinyConfig, tc.edit, "F32")
		resp, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartContext})
		if err != nil {
			t.Fatal(err)
		}
		ops := map[string]bool{} // of the rope scope's nodes
		for _, n := range resp.GetFunction().GetNode() {
			if strings.HasPrefix(n.GetName(), "rope") {
				ops[n.GetOpType()] = true
			}
		}
		if len(ops) == 0 {
			t.Fatal("no rope nodes")
		}
		if got := ops["ReduceMax"] && ops["Where"]; got != tc.switch_ {
			t.Errorf("switch %v, want %v (rope ops %v)", got, tc.switch_, ops)
		}
	}
}
