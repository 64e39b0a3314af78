package decoder_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/hf"
	"github.com/strata-llm/strata/sdk/plugintest"
)

const qwenMoE = `{"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
	"decoder_sparse_step": 2, "mlp_only_layers": [3]}`

func readQwenMoE(t *testing.T, edit func(map[string]any)) (*decoder.Model, decoder.QwenMoE) {
	t.Helper()
	c, err := hf.Parse(plugintest.Config(t, qwenMoE, edit))
	if err != nil {
		t.Fatal(err)
	}
	m := &decoder.Model{Reader: &hf.Reader{Config: c}}
	return m, decoder.ReadQwenMoE(m)
}

// Layer i is sparse unless listed in mlp_only_layers, there are no experts
// or (i+1) is not a multiple of decoder_sparse_step.
func TestQwenMoESparseLayers(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string // per layer 0..5: s sparse, d dense
	}{
		"step 2, 3 listed": {nil, "dsddds"},
		"defaults":         {func(m map[string]any) { delete(m, "decoder_sparse_step"); delete(m, "mlp_only_layers") }, "ssssss"},
		"listed dense":     {func(m map[string]any) { m["decoder_sparse_step"] = 1; m["mlp_only_layers"] = []int{0, 4} }, "dsssds"},
		"no experts":       {func(m map[string]any) { m["num_experts"] = 0; m["decoder_sparse_step"] = 1 }, "dddddd"},
		"local experts":    {func(m map[string]any) { delete(m, "num_experts"); m["num_local_experts"] = 4 }, "dsddds"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m, c := readQwenMoE(t, tc.edit)
			if m.Err != nil {
				t.Fatal(m.Err)
			}
			kindOf := c.KindOf("s", "d")
			var got strings.Builder
			for i := range 6 {
				got.WriteString(kindOf(i))
				if c.Sparse(i) != (kindOf(i) == "s") {
					t.Errorf("layer %d: Sparse %v, KindOf %q", i, c.Sparse(i), kindOf(i))
				}
			}
			if got.String() != tc.want {
				t.Errorf("kinds %s, want %s", got.String(), tc.want)
			}
		})
	}
}

func TestQwenMoECheck(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string // error, or "" for none
	}{
		"fine":            {nil, ""},
		"top-k too big":   {func(m map[string]any) { m["num_experts_per_tok"] = 9 }, "config.json: num_experts_per_tok 9 must be in 1..num_experts (8)"},
		"zero top-k":      {func(m map[string]any) { m["num_experts_per_tok"] = 0 }, "must be in 1..num_experts"},
		"no experts":      {func(m map[string]any) { m["num_experts"] = 0; m["num_experts_per_tok"] = 0 }, ""},
		"sparse step 0":   {func(m map[string]any) { m["decoder_sparse_step"] = 0 }, "decoder_sparse_step must be at least 1, got 0"},
		"zero moe width":  {func(m map[string]any) { m["moe_intermediate_size"] = 0 }, "moe_intermediate_size must be positive"},
		"missing top-k":   {func(m map[string]any) { delete(m, "num_experts_per_tok") }, `"num_experts_per_tok" is missing`},
		"list not a list": {func(m map[string]any) { m["mlp_only_layers"] = 3 }, `"mlp_only_layers"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m, c := readQwenMoE(t, tc.edit)
			err := m.Err
			if err == nil {
				err = c.Check(m)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, c := readQwenMoE(t, nil); c.Normalize || !slices.Equal(c.MLPOnly, []int{3}) || c.Intermediate != 12 || c.TopK != 2 {
		t.Errorf("read %+v", c)
	}
}
