package blocks

import (
	"math"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/hf"
	"github.com/strata-llm/strata/sdk/refeval"
)

func TestClampedSwiGLUMatchesTransformers(t *testing.T) {
	ref := loadRopeReference(t).SwiGLU
	cfg, err := hf.Parse([]byte(`{"swiglu_limit": 7.0}`))
	if err != nil {
		t.Fatal(err)
	}
	act, err := ClampedSwiGLUFromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if act.Alpha != ref.Alpha || act.Limit != ref.Limit {
		t.Fatalf("alpha %g limit %g, transformers %g %g", act.Alpha, act.Limit, ref.Alpha, ref.Limit)
	}
	cases := []struct {
		dt        fn.DType
		gate, up  []float32
		want      []float64
		tolerance float64
	}{
		{fn.Float32, ref.Gate32, ref.Up32, ref.Out32, 1e-6},
		// torch multiplies a half by the float 1.702, we by half(1.702):
		// within a couple of half ulps.
		{fn.Float16, ref.Gate16, ref.Up16, ref.Out16, 2e-3},
	}
	for _, tc := range cases {
		t.Run(tc.dt.String(), func(t *testing.T) {
			f := fn.NewFunc("test", "Act", tc.dt)
			f.Output("out", act.Activation(f, f.Input("gate"), f.Input("up")))
			out, err := refeval.Run(f.Proto(), f.Dependencies(), map[string]refeval.Tensor{
				"gate": refeval.FloatsOf(tc.dt, ref.Shape, tc.gate...), "up": refeval.FloatsOf(tc.dt, ref.Shape, tc.up...)})
			if err != nil {
				t.Fatal(err)
			}
			if out["out"].DType != tc.dt {
				t.Errorf("output dtype %s", out["out"].DType)
			}
			t.Logf("max error %.2g (relative above 1)", compare(t, "out", out["out"].F, tc.want, tc.tolerance))
		})
	}
}

// gpt-oss experts: bias-added gate/up, the clamped activation, down with
// bias, weighted by the router, for both strategies, against loops.
func TestGptOssExperts(t *testing.T) {
	const T, H, I, E, k = 3, 4, 2, 3, 2
	vals := func(n int, seed float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.Sin(seed+float64(i)*1.7) * 4)
		}
		return v
	}
	x, gate, up, down := vals(T*H, 1), vals(E*H*I, 2), vals(E*H*I, 3), vals(E*I*H, 4)
	gb, ub, db := vals(E*I, 5), vals(E*I, 6), vals(E*H, 7)
	weights := []float32{0.7, 0.3, 0.6, 0.4, 0.5, 0.5}
	indices := []int64{2, 0, 1, 2, 0, 1}
	act := ClampedSwiGLU{Alpha: 1.702, Limit: 7}

	want := make([]float64, T*H)
	for tok := range T {
		for j := range k {
			e := int(indices[tok*k+j])
			a := make([]float64, I)
			for i := range I {
				g, u := float64(gb[e*I+i]), float64(ub[e*I+i])
				for h := range H {
					g += float64(x[tok*H+h]) * float64(gate[(e*H+h)*I+i])
					u += float64(x[tok*H+h]) * float64(up[(e*H+h)*I+i])
				}
				g = math.Min(g, 7)
				u = math.Max(math.Min(u, 7), -7)
				a[i] = (u + 1) * g / (1 + math.Exp(-1.702*g))
			}
			for h := range H {
				y := float64(db[e*H+h])
				for i := range I {
					y += a[i] * float64(down[(e*I+i)*H+h])
				}
				want[tok*H+h] += float64(weights[tok*k+j]) * y
			}
		}
	}
	for _, strategy := range ExpertStrategies {
		t.Run(strategy, func(t *testing.T) {
			f := fn.NewFunc("test", "Experts", fn.Float32)
			xin, w, idx := f.Input("x"), f.Input("weights"), f.Input("indices")
			ex := Experts{Gate: f.Input("gate"), Up: f.Input("up"), Down: f.Input("down"),
				GateBias: f.Input("gate_bias"), UpBias: f.Input("up_bias"), DownBias: f.Input("down_bias"),
				Activation: act.Activation}
			y, err := ex.Apply(f, strategy, xin, w, idx, E)
			if err != nil {
				t.Fatal(err)
			}
			f.Output("y", y)
			out, err := refeval.Run(f.Proto(), f.Dependencies(), map[string]refeval.Tensor{
				"x": refeval.Floats([]int64{T, H}, x...), "weights": refeval.Floats([]int64{T, k}, weights...),
				"indices": refeval.Ints([]int64{T, k}, indices...),
				"gate":    refeval.Floats([]int64{E, H, I}, gate...), "up": refeval.Floats([]int64{E, H, I}, up...),
				"down":      refeval.Floats([]int64{E, I, H}, down...),
				"gate_bias": refeval.Floats([]int64{E, I}, gb...), "up_bias": refeval.Floats([]int64{E, I}, ub...),
				"down_bias": refeval.Floats([]int64{E, H}, db...)})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("max error %.2g", compare(t, "y", out["y"].F, want, 1e-5))
		})
	}
}

func TestClampedSwiGLUConfigErrors(t *testing.T) {
	for config, want := range map[string]string{
		`{"swiglu_limit": 0}`:     "swiglu_limit must be a finite number > 0, got 0",
		`{"swiglu_limit": -7}`:    "swiglu_limit must be a finite number > 0, got -7",
		`{"swiglu_alpha": "x"}`:   `"swiglu_alpha" must be`,
		`{"swiglu_limit": 1e999}`: `"swiglu_limit" must be a number`, // out of float64 range
	} {
		cfg, err := hf.Parse([]byte(config))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ClampedSwiGLUFromConfig(cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to contain %q", config, err, want)
		}
	}
}
