package main

import (
	"context"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/refeval"
)

// tinyConfig is shaped like transformers 5's save of a Qwen2Config with
// use_sliding_window: layer 0 full attention, layer 1 a window of 4.
const tinyConfig = `{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 32,
	"intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
	"vocab_size": 64, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": true,
	"use_sliding_window": true, "sliding_window": 4, "max_window_layers": 1,
	"layer_types": ["full_attention", "sliding_attention"],
	"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}`

func TestDescribe(t *testing.T) {
	d, err := plugin.Describe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.GetProtocolVersion() != sdk.ProtocolVersion || len(d.GetArchitectures()) != 1 ||
		d.GetArchitectures()[0].GetModelType() != "qwen2" {
		t.Errorf("describe: %v", d)
	}
}

func TestRefusals(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"gelu":           {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu" is not supported by the qwen2 plugin`},
		"partial rotary": {func(m map[string]any) { m["partial_rotary_factor"] = 0.5 }, "partial_rotary_factor (rotary dimension 4 of head_dim 8)"},
		"zero window":    {func(m map[string]any) { m["sliding_window"] = 0 }, "sliding_window must be positive"},
		"sliding without window": {func(m map[string]any) { m["use_sliding_window"] = false },
			"layer_types[1] is sliding_attention but there is no window"},
		"unknown layer type": {func(m map[string]any) { m["layer_types"] = []string{"full_attention", "chunked_attention"} },
			`layer_types[1] is "chunked_attention"`},
		"layer_types length": {func(m map[string]any) { m["layer_types"] = []string{"full_attention"} },
			"layer_types has 1 entries for 2 layers"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tinyConfig, tc.edit, "F32")
			if ok, reasons := plugintest.Check(t, plugin, model); ok || !strings.Contains(reasons, tc.want) {
				t.Errorf("supported=%v reasons=%q, want %q", ok, reasons, tc.want)
			}
		})
	}
}

// Each layer's kind as Qwen2Config reads it: layer_types when given, else
// sliding from max_window_layers on, only with use_sliding_window.
func TestLayerKinds(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want []string
	}{
		"layer_types": {nil, []string{"full_attention", "sliding_attention"}},
		"from max_window_layers": {func(m map[string]any) { delete(m, "layer_types"); m["max_window_layers"] = 0 },
			[]string{"sliding_attention", "sliding_attention"}},
		"default max_window_layers 28": {func(m map[string]any) { delete(m, "layer_types"); delete(m, "max_window_layers") },
			[]string{"full_attention", "full_attention"}},
		"no sliding": {func(m map[string]any) { delete(m, "layer_types"); m["use_sliding_window"] = false },
			[]string{"full_attention", "full_attention"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := plugintest.Edited(t, plugin, tinyConfig, tc.edit, "BF16")
			if ok, reasons := plugintest.Check(t, plugin, model); !ok {
				t.Fatalf("refused: %s", reasons)
			}
			plan, got := plugintest.Kinds(t, plugin, model, nil)
			if !slices.Equal(got, tc.want) {
				t.Errorf("kinds %v, want %v", got, tc.want)
			}
			if sliding := slices.Contains(plan.GetContextOutputs(), "sliding_mask"); sliding != slices.Contains(tc.want, "sliding_attention") {
				t.Errorf("context outputs %v", plan.GetContextOutputs())
			}
		})
	}
}

// Every part binds every weight it reads to a tensor of the checkpoint;
// q/k/v have biases, o_proj none; the head is the tied embedding.
func TestBound(t *testing.T) {
	model := plugintest.Model(t, plugin, []byte(tinyConfig), "BF16")
	bound := plugintest.RequireBound(t, plugin, model,
		&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: "full_attention", Layers: []int32{0}},
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: "sliding_attention", Layers: []int32{1}},
		&pb.BuildRequest{Part: sdk.PartFinal})
	for _, layer := range []map[int32]plugintest.Bindings{bound[2], bound[3]} {
		for i, b := range layer {
			keys := slices.Concat(slices.Collect(maps.Values(b))...)
			for _, want := range []string{"q_proj.bias", "k_proj.bias", "v_proj.bias"} {
				if !slices.ContainsFunc(keys, func(k string) bool { return strings.HasSuffix(k, want) }) {
					t.Errorf("layer %d binds no %s: %v", i, want, keys)
				}
			}
			if slices.ContainsFunc(keys, func(k string) bool { return strings.HasSuffix(k, "o_proj.bias") }) {
				t.Errorf("layer %d binds an o_proj bias", i)
			}
		}
	}
	final := slices.Concat(slices.Collect(maps.Values(bound[4][-1]))...)
	if !slices.Contains(final, "model.embed_tokens.weight") {
		t.Errorf("tied head: final binds %v", final)
	}
}

// The sliding layer, evaluated with sdk/refeval on the context part's
// values: given the same weights, layer 0 (full) and layer 1 (sliding)
// agree where every earlier position is in the window
// (positions 0..3 of a window of 4) and differ after.
func TestSlidingLayerMasksPastTheWindow(t *testing.T) {
	model := plugintest.Model(t, plugin, []byte(tinyConfig), "F32")
	shapes := map[string][]int64{}
	want, err := plugin.ExpectedTensors(model)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		shapes[w.Key] = w.Shape
	}
	const S, H, C, kv, hd = 6, 32, 8, 2, 8
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(shape ...int64) refeval.Tensor {
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 0.3)
		}
		return refeval.Floats(shape, v...)
	}
	positions := refeval.Ints([]int64{1, S}, 0, 1, 2, 3, 4, 5)
	cache := refeval.Floats([]int64{1, kv, C, hd}, make([]float32, kv*C*hd)...)
	ctx := run(t, model, &pb.BuildRequest{Part: sdk.PartContext},
		map[string]refeval.Tensor{sdk.PositionIDs: positions, decoder.PastKey: cache})
	weights := map[string]refeval.Tensor{}
	hidden := random(1, S, H)
	outputs := map[string]refeval.Tensor{}
	for i, kind := range []string{"full_attention", "sliding_attention"} {
		req := &pb.BuildRequest{Part: sdk.PartLayer, Kind: kind, Layers: []int32{int32(i)}}
		resp, err := plugin.Build(context.Background(), withModel(req, model))
		if err != nil {
			t.Fatal(err)
		}
		in := map[string]refeval.Tensor{sdk.HiddenStates: hidden, sdk.PositionIDs: positions,
			decoder.PastKey: cache, decoder.PastValue: cache}
		for _, b := range resp.GetWeights()[0].GetBindings() {
			if _, ok := weights[b.GetInput()]; !ok { // by formal name: the same for both layers
				weights[b.GetInput()] = random(shapes[b.GetKey()]...)
			}
			in[b.GetInput()] = weights[b.GetInput()]
		}
		for _, name := range resp.GetFunction().GetInput() {
			if v, ok := ctx[name]; ok {
				in[name] = v
			}
		}
		out, err := refeval.Run(resp.GetFunction(), resp.GetDependencies(), in)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		outputs[kind] = out[sdk.HiddenStatesOut]
	}
	full, sliding := outputs["full_attention"], outputs["sliding_attention"]
	for p := range S {
		var diff float64
		for i := range H {
			diff = max(diff, math.Abs(float64(full.F[p*H+i]-sliding.F[p*H+i])))
		}
		if inWindow := p < 4; inWindow && diff > 1e-6 || !inWindow && diff < 1e-3 {
			t.Errorf("position %d: full and sliding differ by %.2g", p, diff)
		}
	}
}

// run builds a part and evaluates it with refeval.
func run(t *testing.T, model *pb.Model, req *pb.BuildRequest, in map[string]refeval.Tensor) map[string]refeval.Tensor {
	t.Helper()
	resp, err := plugin.Build(context.Background(), withModel(req, model))
	if err != nil {
		t.Fatal(err)
	}
	out, err := refeval.Run(resp.GetFunction(), resp.GetDependencies(), in)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func withModel(req *pb.BuildRequest, model *pb.Model) *pb.BuildRequest { req.Model = model; return req }
