package blocks_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/refeval"
)

// ReplacePlaceholders against masked_scatter written as a loop: row k goes
// to the k-th placeholder counted row-major over [B,S]; other positions
// keep their embedding; rows that do not number the placeholders fail.
func TestReplacePlaceholders(t *testing.T) {
	const token, W = 9, 2
	f := fn.NewFunc("t", "replace", fn.Float32)
	f.Output("y", blocks.ReplacePlaceholders(f, f.Input("embedded"), f.Input("ids"), f.Input("rows"), token, W))
	rows := func(n int) refeval.Tensor {
		v := make([]float32, n*W)
		for i := range v {
			v[i] = float32(100 + i)
		}
		return refeval.Floats([]int64{int64(n), W}, v...)
	}
	cases := map[string]struct {
		ids  []int64 // [2, 3]
		rows int
		err  bool
	}{
		"across the batch": {[]int64{1, 9, 9, 9, 2, 3}, 3, false},
		"none, zero rows":  {[]int64{1, 2, 3, 4, 5, 6}, 0, false},
		"all":              {[]int64{9, 9, 9, 9, 9, 9}, 6, false},
		"one row short":    {[]int64{1, 9, 9, 9, 2, 3}, 2, true},
		"one row over":     {[]int64{1, 9, 9, 9, 2, 3}, 4, true},
		"rows, no tokens":  {[]int64{1, 2, 3, 4, 5, 6}, 1, true},
	}
	embedded := make([]float32, 6*W)
	for i := range embedded {
		embedded[i] = float32(-i)
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			in := map[string]refeval.Tensor{"embedded": refeval.Floats([]int64{2, 3, W}, embedded...),
				"ids": refeval.Ints([]int64{2, 3}, tc.ids...), "rows": rows(tc.rows)}
			out, err := refeval.Run(f.Proto(), f.Dependencies(), in)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), "Reshape") {
					t.Fatalf("error %v, want the Reshape to refuse %d rows", err, tc.rows)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want, k := slices.Clone(embedded), 0
			for p, id := range tc.ids {
				if id == token {
					copy(want[p*W:(p+1)*W], in["rows"].F[k*W:(k+1)*W])
					k++
				}
			}
			if !slices.Equal(out["y"].F, want) {
				t.Errorf("got %v, want %v", out["y"].F, want)
			}
		})
	}
}
