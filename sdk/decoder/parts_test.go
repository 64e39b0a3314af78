package decoder

import (
	"math"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/refeval"
	"github.com/strata-llm/strata/sdk/weight"
)

// The final part with the model's FinalSoftCap against loops: each row's
// last valid token RMS-normed (Gemma's 1 + w), projected, and capped as
// cap·tanh(logit/cap); with the cap unset, the raw logits.
func TestFinalPartSoftCap(t *testing.T) {
	const B, S, H, V = 2, 3, 4, 5
	hidden := make([]float32, B*S*H)
	for i := range hidden {
		hidden[i] = float32(i%7) - 3
	}
	head := make([]float32, V*H)
	for i := range head {
		head[i] = 1.5 * (float32(i%5) - 2)
	}
	norm := []float32{0.5, -0.25, 0, 1}
	pos := []int64{0, 1, 2, 0, 1, -1}
	in := map[string]refeval.Tensor{sdk.HiddenStates: refeval.Floats([]int64{B, S, H}, hidden...),
		sdk.PositionIDs: refeval.Ints([]int64{B, S}, pos...),
		"norm.weight":   refeval.Floats([]int64{H}, norm...), "lm_head.weight": refeval.Floats([]int64{V, H}, head...)}
	n, h := weight.Tensor("norm", H), weight.Tensor("head", V, H)
	for _, limit := range []float64{0, 3} {
		for _, allHidden := range []bool{false, true} {
			m := &Model{NormOnePlus: true, FinalSoftCap: limit}
			m.Eps = 1e-6
			got := evalPart(t, finalPart("t", "F", fn.Float32, m.norm(), m.FinalSoftCap, n, h, allHidden, 2), in)[sdk.Logits]
			bites := false
			for b, tok := range []int{2, S + 1} { // each row's last valid token
				x := hidden[tok*H : (tok+1)*H]
				var ss float64
				for _, v := range x {
					ss += float64(v) * float64(v)
				}
				r := 1 / math.Sqrt(ss/H+1e-6)
				for o := range V {
					var logit float64
					for i := range H {
						logit += float64(x[i]) * r * (1 + float64(norm[i])) * float64(head[o*H+i])
					}
					bites = bites || math.Abs(logit) > limit
					if limit != 0 {
						logit = limit * math.Tanh(logit/limit)
					}
					if g := float64(got.F[b*V+o]); math.Abs(g-logit) > 1e-5*math.Max(1, math.Abs(logit)) {
						t.Errorf("cap %g allHidden %v: logits[%d,%d] = %g, want %g", limit, allHidden, b, o, g, logit)
					}
				}
			}
			if !bites {
				t.Fatalf("no logit exceeds the cap %g: the case does not test it", limit)
			}
		}
	}
}
