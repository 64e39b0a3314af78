package blocks

import (
	"slices"
	"testing"

	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/refeval"
)

// TestORTCachesFoldable: the RoPE caches' length is the context length, a
// constant ONNX Runtime folds at session creation, unless longrope's
// factors switch with the length; then it is attention_mask's width.
func TestORTCachesFoldable(t *testing.T) {
	for _, tc := range []struct {
		name string
		rope RoPE
		want string // the op producing Range's limit
	}{
		{"default", RoPE{Type: "default", Base: 10000, Dim: 8, AttentionScaling: 1}, "Constant"},
		{"longrope", RoPE{Type: "longrope", Base: 10000, Dim: 8, AttentionScaling: 1.2, OriginalMaxPositions: 16,
			ShortFactor: []float64{1, 1, 1, 1}, LongFactor: []float64{2, 2, 2, 2}}, "Gather"},
	} {
		f := fn.NewFunc("test", "Ctx", fn.Float32)
		ORTContextValues(f, f.Input("attention_mask"), tc.rope, 4096)
		producer := map[string]string{}
		var limit string
		for _, n := range f.Proto().GetNode() {
			for _, o := range n.GetOutput() {
				producer[o] = n.GetOpType()
			}
			if n.GetOpType() == "Range" {
				limit = n.GetInput()[1]
			}
		}
		if got := producer[limit]; got != tc.want {
			t.Errorf("%s: Range's limit %s comes from %q, want %s", tc.name, limit, got, tc.want)
		}
	}
}

// TestLastAttendedToken: each row's last new token attention_mask marks,
// as onnxruntime-genai feeds it: right padding, a chunk after past tokens,
// a decode step, a row of padding only.
func TestLastAttendedToken(t *testing.T) {
	for _, tc := range []struct {
		name string
		mask []int64 // [2, T]
		seq  int64   // S: the new tokens, the mask's last S columns
		want []int64 // per row: the position picked among the new tokens
	}{
		{"right padded prompt", []int64{1, 1, 1, 1, 1, 1, 0, 0}, 4, []int64{3, 1}},
		{"chunk after past", []int64{1, 1, 1, 1, 1, 1, 1, 0}, 2, []int64{1, 0}},
		{"decode step", []int64{1, 1, 1, 1, 1, 1, 0, 1}, 1, []int64{0, 0}},
		{"a row of padding", []int64{1, 1, 1, 1, 0, 0, 0, 0}, 4, []int64{3, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const hidden = 2
			f := fn.NewFunc("test", "Last", fn.Float32)
			f.Output("last", LastAttendedToken(f, f.Input("hidden"), f.Input("mask")))
			h := make([]float32, 2*tc.seq*hidden) // row b, position s: b*100 + s in both features
			for i := range h {
				h[i] = float32(int64(i)/(tc.seq*hidden)*100 + int64(i)%(tc.seq*hidden)/hidden)
			}
			width := int64(len(tc.mask)) / 2
			out, err := refeval.Run(f.Proto(), f.Dependencies(), map[string]refeval.Tensor{
				"hidden": refeval.Floats([]int64{2, tc.seq, hidden}, h...), "mask": refeval.Ints([]int64{2, width}, tc.mask...)})
			if err != nil {
				t.Fatal(err)
			}
			got := out["last"]
			if !slices.Equal(got.Shape, []int64{2, 1, hidden}) {
				t.Fatalf("shape %v, want [2 1 %d]", got.Shape, hidden)
			}
			for b, s := range tc.want {
				if want := float32(int64(b)*100 + s); got.F[b*hidden] != want || got.F[b*hidden+1] != want {
					t.Errorf("row %d: picked %v, want position %d", b, got.F[b*hidden:(b+1)*hidden], s)
				}
			}
		})
	}
}
