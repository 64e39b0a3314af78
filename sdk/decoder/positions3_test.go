package decoder

import (
	"slices"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/refeval"
	"github.com/strata-llm/strata/sdk/weight"
)

func evalPart(t *testing.T, resp *pb.BuildResponse, in map[string]refeval.Tensor) map[string]refeval.Tensor {
	t.Helper()
	out, err := refeval.Run(resp.GetFunction(), resp.GetDependencies(), in)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The rank-3 context part: with three equal rows it computes what the
// rank-2 part computes from one (tables, mask, read indices), and outputs
// row 0 as CtxPositions; with rows that differ, the mask and indices still
// follow row 0 while the tables take each frequency's row (RoPE.Tables3).
func TestContextPartRank3(t *testing.T) {
	rope := blocks.RoPE{Type: "default", Base: 10000, Dim: 16, AttentionScaling: 1, MRoPESection: []int{4, 2, 2}}
	const B, S, C = 2, 3, 5
	row := []int64{0, 1, 2, 3, -1, -1} // [B,S]: a padded second row
	cache := refeval.Floats([]int64{B, 1, C, 16}, make([]float32, B*C*16)...)
	two := evalPart(t, contextPart("t", "Ctx2", fn.Float32, rope, nil, nil, positions{rank: 2}, PastKey),
		map[string]refeval.Tensor{sdk.PositionIDs: refeval.Ints([]int64{B, S}, row...), PastKey: cache})
	equal := append(append(slices.Clone(row), row...), row...)
	three := evalPart(t, contextPart("t", "Ctx3", fn.Float32, rope, nil, nil, positions{rank: 3, rows: 3}, PastKey),
		map[string]refeval.Tensor{sdk.PositionIDs: refeval.Ints([]int64{3, B, S}, equal...), PastKey: cache})
	for _, name := range StandardContext {
		a, b := two[name], three[name]
		if !slices.Equal(a.Shape, b.Shape) || !slices.Equal(a.F, b.F) || !slices.Equal(a.I, b.I) || !slices.Equal(a.B, b.B) {
			t.Errorf("%s: rank 3 with equal rows differs from rank 2", name)
		}
	}
	if got := three[CtxPositions]; !slices.Equal(got.I, row) || !slices.Equal(got.Shape, []int64{B, S}) {
		t.Errorf("positions %v %v, want row 0 %v", got.Shape, got.I, row)
	}
	if _, ok := two[CtxPositions]; ok {
		t.Errorf("the rank-2 context outputs %s", CtxPositions)
	}

	// Rows that differ: H and W rows shifted.
	rows := append(append(slices.Clone(row), 10, 11, 12, 13, 14, 15), 20, 21, 22, 23, 24, 25)
	diff := evalPart(t, contextPart("t", "Ctx3", fn.Float32, rope, nil, nil, positions{rank: 3, rows: 3}, PastKey),
		map[string]refeval.Tensor{sdk.PositionIDs: refeval.Ints([]int64{3, B, S}, rows...), PastKey: cache})
	for _, name := range []string{CtxMask, CtxReadIndices, CtxReadInvalid} {
		if !slices.Equal(diff[name].B, two[name].B) || !slices.Equal(diff[name].I, two[name].I) {
			t.Errorf("%s does not follow row 0", name)
		}
	}
	// cos [B,1,S,16]: frequency j turns with row mropeRow(j) (j and j+8).
	inv := rope.InvFreq()
	cos := diff[CtxCos]
	for j := range 8 {
		r := 0 // transformers' interleaving: H for j%3 == 1 below 3·h, W for j%3 == 2 below 3·w
		switch {
		case j%3 == 1 && j < 3*rope.MRoPESection[1]:
			r = 1
		case j%3 == 2 && j < 3*rope.MRoPESection[2]:
			r = 2
		}
		p := float32(rows[r*B*S+1]) // batch 0, token 1
		want := refeval.Floats([]int64{1}, p*inv[j])
		if got := cos.F[1*16+j]; !approxEqual(got, cosOf(want.F[0])) {
			t.Errorf("cos[token 1, freq %d] = %g, want cos(%g) from row %d", j, got, want.F[0], r)
		}
	}
}

// Four rows (vision inputs): the tables are those of the last three rows
// given as three, while the mask, the read indices and CtxPositions follow
// row 0, the text positions, even where the t row differs from it (an
// image's tokens share one t).
func TestContextPartFourRows(t *testing.T) {
	rope := blocks.RoPE{Type: "default", Base: 10000, Dim: 16, AttentionScaling: 1, MRoPESection: []int{4, 2, 2}}
	const B, S, C = 2, 3, 5
	text := []int64{0, 1, 2, 3, -1, -1}
	cache := refeval.Floats([]int64{B, 1, C, 16}, make([]float32, B*C*16)...)
	thw := []int64{0, 1, 1, 3, 0, 0, 0, 1, 2, 3, 0, 0, 0, 2, 2, 3, 0, 0}
	three := evalPart(t, contextPart("t", "Ctx3", fn.Float32, rope, nil, nil, positions{rank: 3, rows: 3}, PastKey),
		map[string]refeval.Tensor{sdk.PositionIDs: refeval.Ints([]int64{3, B, S}, thw...), PastKey: cache})
	four := evalPart(t, contextPart("t", "Ctx4", fn.Float32, rope, nil, nil, positions{rank: 3, rows: 4}, PastKey),
		map[string]refeval.Tensor{sdk.PositionIDs: refeval.Ints([]int64{4, B, S}, append(slices.Clone(text), thw...)...), PastKey: cache})
	two := evalPart(t, contextPart("t", "Ctx2", fn.Float32, rope, nil, nil, positions{rank: 2}, PastKey),
		map[string]refeval.Tensor{sdk.PositionIDs: refeval.Ints([]int64{B, S}, text...), PastKey: cache})
	for _, name := range []string{CtxCos, CtxSin} {
		if !slices.Equal(four[name].F, three[name].F) {
			t.Errorf("%s: four rows differ from their last three", name)
		}
	}
	for _, name := range []string{CtxMask, CtxReadIndices, CtxReadInvalid} {
		if !slices.Equal(four[name].B, two[name].B) || !slices.Equal(four[name].I, two[name].I) {
			t.Errorf("%s does not follow row 0 (the text row)", name)
		}
	}
	if got := four[CtxPositions]; !slices.Equal(got.I, text) {
		t.Errorf("positions %v, want the text row %v", got.I, text)
	}
}

func cosOf(x float32) float32 {
	f := fn.NewFunc("t", "cos", fn.Float32)
	f.Output("y", f.Cos(f.Input("x")))
	out, _ := refeval.Run(f.Proto(), nil, map[string]refeval.Tensor{"x": refeval.Floats(nil, x)})
	return out["y"].F[0]
}

func approxEqual(a, b float32) bool { return a-b < 1e-6 && b-a < 1e-6 }

// The rank-3 final part picks each row's last valid token by row 0.
func TestFinalPartRank3(t *testing.T) {
	const B, S, H, V = 2, 3, 4, 3
	hidden := make([]float32, B*S*H)
	for i := range hidden {
		hidden[i] = float32(i%7) - 3
	}
	head := make([]float32, V*H)
	for i := range head {
		head[i] = float32(i%5) - 2
	}
	norm := []float32{1, 1, 1, 1}
	in := func(pos refeval.Tensor) map[string]refeval.Tensor {
		return map[string]refeval.Tensor{sdk.HiddenStates: refeval.Floats([]int64{B, S, H}, hidden...), sdk.PositionIDs: pos,
			"norm.weight": refeval.Floats([]int64{H}, norm...), "lm_head.weight": refeval.Floats([]int64{V, H}, head...)}
	}
	n, h := weight.Tensor("norm", H), weight.Tensor("head", V, H)
	row := []int64{0, 1, 2, 0, 1, -1}
	two := evalPart(t, finalPart("t", "F2", fn.Float32, blocks.Norm{Eps: 1e-6}, 0, n, h, false, 2), in(refeval.Ints([]int64{B, S}, row...)))
	// Rows 1 and 2 would pick other tokens (their largest entries are elsewhere).
	rows := append(slices.Clone(row), 9, 0, 0, 9, 0, 0, 9, 0, 0, 0, 0, 9)
	three := evalPart(t, finalPart("t", "F3", fn.Float32, blocks.Norm{Eps: 1e-6}, 0, n, h, false, 3), in(refeval.Ints([]int64{3, B, S}, rows...)))
	if !slices.Equal(two[sdk.Logits].F, three[sdk.Logits].F) {
		t.Errorf("rank-3 logits %v, want row 0's %v", three[sdk.Logits].F, two[sdk.Logits].F)
	}
}
