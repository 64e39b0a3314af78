package blocks_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/refeval"
)

// The SDK's pieces for Gemma-style decoders against loops: the RMSNorm
// weighing by 1 + w, the activations, the embedding scale, the final norm
// and a second pair of RoPE tables.

// onePlus is 1 + w, the weight Gemma's RMSNorm applies.
func onePlus(w []float32) []float32 {
	out := make([]float32, len(w))
	for i, v := range w {
		out[i] = 1 + v
	}
	return out
}

func geluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func geluErf(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }

func TestRMSNormOnePlus(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	x, w := randoms(r, 2*3*8), randoms(r, 8)
	for _, norm := range []blocks.Norm{{Eps: 1e-6, OnePlus: true}, {Eps: 1e-6}} {
		f := fn.NewFunc("test", "Norm", fn.Float32)
		f.Output("y", norm.Apply(f, f.Input("x"), f.Input("w")))
		got := run(t, f, map[string]refeval.Tensor{"x": refeval.Floats([]int64{2, 3, 8}, x...), "w": refeval.Floats([]int64{8}, w...)})["y"]
		weight := w
		if norm.OnePlus {
			weight = onePlus(w)
		}
		var want []float64
		for row := range 6 {
			want = append(want, rmsNorm(f64(x[row*8:(row+1)*8]), weight, 1e-6)...)
		}
		closeTo(t, "rmsnorm", got.F, want, 1e-6)
	}
}

// In bfloat16, Gemma's norm computes in float32 and rounds once at the end
// (transformers' (x·w).to(bfloat16), not x.to(bfloat16)·w).
func TestRMSNormOnePlusBF16RoundsOnce(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	x, w := randoms(r, 4*16), randoms(r, 16)
	bf := func(v []float32) []float32 {
		out := refeval.FloatsOf(refeval.BFloat16, []int64{int64(len(v))}, v...).F
		return out
	}
	xb, wb := bf(x), bf(w)
	f := fn.NewFunc("test", "Norm", refeval.BFloat16)
	f.Output("y", blocks.RMSNormOnePlus(f, f.Input("x"), f.Input("w"), 1e-6))
	got := run(t, f, map[string]refeval.Tensor{"x": refeval.FloatsOf(refeval.BFloat16, []int64{4, 16}, xb...), "w": refeval.FloatsOf(refeval.BFloat16, []int64{16}, wb...)})["y"]
	var want []float64
	for row := range 4 {
		want = append(want, rmsNorm(f64(xb[row*16:(row+1)*16]), onePlus(wb), 1e-6)...)
	}
	want32 := make([]float32, len(want))
	for i, v := range want {
		want32[i] = float32(v)
	}
	closeTo(t, "bf16 norm", got.F, f64(bf(want32)), 1e-2)
	exact := 0
	for i, v := range bf(want32) {
		if got.F[i] == v {
			exact++
		}
	}
	if exact < len(want)*9/10 { // a double rounding would miss about half
		t.Errorf("%d of %d values are the float32 result rounded once", exact, len(want))
	}
}

// TestGatedMLPActivations: blocks.SwiGLU with each activation against
// down(act(gate(x))·up(x)) as loops.
func TestGatedMLPActivations(t *testing.T) {
	const N, H, I = 5, 6, 7
	r := rand.New(rand.NewPCG(15, 16))
	x, gate, up, down := randoms(r, N*H), randoms(r, I*H), randoms(r, I*H), randoms(r, H*I)
	acts := map[blocks.Activation]func(float64) float64{
		"":                 func(v float64) float64 { return v / (1 + math.Exp(-v)) },
		blocks.ActSiLU:     func(v float64) float64 { return v / (1 + math.Exp(-v)) },
		blocks.ActGELUTanh: geluTanh,
		blocks.ActGELU:     geluErf,
	}
	for act, ref := range acts {
		f := fn.NewFunc("test", "MLP", fn.Float32)
		mlp := blocks.SwiGLU{Gate: blocks.LinearInputs(f, "gate", false), Up: blocks.LinearInputs(f, "up", false),
			Down: blocks.LinearInputs(f, "down", false), Act: act}
		f.Output("y", mlp.Apply(f, f.Input("x")))
		got := run(t, f, map[string]refeval.Tensor{"x": refeval.Floats([]int64{N, H}, x...),
			"gate.weight": refeval.Floats([]int64{I, H}, gate...), "up.weight": refeval.Floats([]int64{I, H}, up...),
			"down.weight": refeval.Floats([]int64{H, I}, down...)})["y"]
		g, u := linear(f64(x), N, gate, I, nil), linear(f64(x), N, up, I, nil)
		for i := range g {
			g[i] = ref(g[i]) * u[i]
		}
		closeTo(t, "mlp "+string(act), got.F, linear(g, N, down, H, nil), 1e-5)
	}
	if blocks.Activation("relu2").Known() || !blocks.Activation("").Known() {
		t.Error("Known: relu2 known or the default unknown")
	}
}

// TestGemmaStyleParts: a model with EmbedScale, NormOnePlus and a second
// RoPE (AddRoPE) that some attention turns by: the embed part scales the
// rows, the final part norms by 1 + w, the context part outputs the second
// tables, and the layer reads them instead of the model's.
func TestGemmaStyleParts(t *testing.T) {
	const V, H = 16, 8
	config := []byte(`{"model_type": "toy", "hidden_size": 8, "intermediate_size": 6, "num_hidden_layers": 2,
		"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": true}`)
	local := blocks.RoPE{Type: "default", Base: 10, Dim: 4, AttentionScaling: 1}
	plugin := decoder.Plugin{Name: "toy", Version: "1", Architectures: []decoder.Architecture{{ModelType: "toy", Name: "Toy",
		Load: func(m *decoder.Model) error {
			m.NormOnePlus, m.EmbedScale = true, math.Sqrt(H)
			m.AddRoPE("local", local)
			m.KindOf = func(i int) string { return []string{"local", "global"}[i] }
			m.Kind("local", "ToyLocal", func(l *decoder.Layer) error {
				return l.PreNorm(&decoder.Attention{QKNorm: true, RoPE: "local"}, &decoder.SwiGLU{Width: m.Intermediate, Act: blocks.ActGELUTanh})
			})
			m.Kind("global", "ToyGlobal", func(l *decoder.Layer) error {
				return l.PreNorm(&decoder.Attention{QKNorm: true}, &decoder.SwiGLU{Width: m.Intermediate, Act: blocks.ActGELUTanh})
			})
			return nil
		}}}}
	model := plugintest.Model(t, plugin, config, "F32")
	build := func(req *pb.BuildRequest) *pb.BuildResponse {
		req.Model = model
		resp, err := plugin.Build(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	r := rand.New(rand.NewPCG(17, 18))
	table, norm := randoms(r, V*H), randoms(r, H)

	embed := build(&pb.BuildRequest{Part: sdk.PartEmbed})
	res, err := refeval.Run(embed.GetFunction(), embed.GetDependencies(), map[string]refeval.Tensor{
		sdk.InputIDs: refeval.Ints([]int64{1, 2}, 3, 5), "embed_tokens.weight": refeval.Floats([]int64{V, H}, table...)})
	if err != nil {
		t.Fatal(err)
	}
	var want []float64
	for _, id := range []int{3, 5} {
		for _, v := range table[id*H : (id+1)*H] {
			want = append(want, float64(v)*float64(float32(math.Sqrt(H))))
		}
	}
	closeTo(t, "scaled embeddings", res[sdk.HiddenStates].F, want, 1e-6)

	final := build(&pb.BuildRequest{Part: sdk.PartFinal})
	hidden := randoms(r, 2*H)
	res, err = refeval.Run(final.GetFunction(), final.GetDependencies(), map[string]refeval.Tensor{
		sdk.HiddenStates: refeval.Floats([]int64{1, 2, H}, hidden...), sdk.PositionIDs: refeval.Ints([]int64{1, 2}, 0, 1),
		"norm.weight": refeval.Floats([]int64{H}, norm...), "lm_head.weight": refeval.Floats([]int64{V, H}, table...)})
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "logits", res[sdk.Logits].F, linear(rmsNorm(f64(hidden[H:]), onePlus(norm), 1e-6), 1, table, V, nil), 1e-5)

	ctx := build(&pb.BuildRequest{Part: sdk.PartContext})
	res, err = refeval.Run(ctx.GetFunction(), ctx.GetDependencies(), map[string]refeval.Tensor{
		sdk.PositionIDs: refeval.Ints([]int64{1, 2}, 2, 3), decoder.PastKey: refeval.Floats([]int64{1, 1, 4, 4}, make([]float32, 16)...)})
	if err != nil {
		t.Fatal(err)
	}
	for name, base := range map[string]float64{decoder.CtxCos: 1e6, "local_cos": 10} {
		var want []float64
		for _, p := range []float64{2, 3} {
			for j := range 4 {
				want = append(want, math.Cos(p*math.Pow(base, -float64(2*(j%2))/4)))
			}
		}
		closeTo(t, name, res[name].F, want, 1e-6)
	}
	if got := res["local_sin"]; !slices.Equal(got.Shape, []int64{1, 1, 2, 4}) || math.Abs(float64(got.F[1])-math.Sin(2/math.Sqrt(10))) > 1e-6 {
		t.Errorf("local_sin %v %v", got.Shape, got.F)
	}
	plan, err := plugin.Plan(context.Background(), &pb.PlanRequest{Model: model})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(plan.GetContextOutputs(), "local_cos") || !slices.Contains(plan.GetContextOutputs(), "local_sin") {
		t.Errorf("plan's context outputs %v lack the local tables", plan.GetContextOutputs())
	}
	inputs := func(kind string) []string {
		return build(&pb.BuildRequest{Part: sdk.PartLayer, Kind: kind, Layers: []int32{map[string]int32{"local": 0, "global": 1}[kind]}}).GetFunction().GetInput()
	}
	if in := inputs("local"); !slices.Contains(in, "local_cos") || !slices.Contains(in, "local_sin") {
		t.Errorf("the local layer's inputs %v lack the local tables", in)
	}
	if in := inputs("global"); slices.Contains(in, "local_cos") {
		t.Errorf("the global layer reads the local tables: %v", in)
	}
}
