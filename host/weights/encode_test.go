package weights

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/strata-llm/strata/host/weights/transform"
)

// The hand encoding of weights is json.Marshal's, over random weights with
// escapes, non-ASCII, nil and empty lists and nested expressions; a spec's
// Compact and Marshal parse back to the spec.
func TestWeightEncodingIsJSONMarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	names := []string{"model.layers.0.mlp.experts.7.up_proj.weight", `q"uote\back`, "<html>&amp;", "tab\there", "é ü ∑", "\u2028line", "bad\xffutf8", ""}
	str := func() string { return names[rng.IntN(len(names))] }
	ints := func() []int64 {
		switch rng.IntN(3) {
		case 0:
			return nil
		case 1:
			return []int64{}
		}
		v := make([]int64, 1+rng.IntN(3))
		for i := range v {
			v[i] = rng.Int64N(1<<40) - 1<<39
		}
		return v
	}
	var expr func(depth int) *transform.Expr
	expr = func(depth int) *transform.Expr {
		if depth == 0 || rng.IntN(3) == 0 {
			return transform.Leaf(str())
		}
		e := &transform.Expr{Op: "op" + str(), Ints: ints(), Axis: rng.Int64N(3) - 1, Start: rng.Int64N(2), End: rng.Int64N(5), Step: rng.Int64N(2), To: str()}
		for range rng.IntN(4) {
			e.Args = append(e.Args, expr(depth-1))
		}
		return e
	}
	for i := range 500 {
		w := Weight{Name: str(), DType: str(), Shape: ints()}
		if rng.IntN(4) > 0 {
			w.Sources = []Source{}
			for range rng.IntN(4) {
				w.Sources = append(w.Sources, NewSource(str(), rng.IntN(9), rng.Int64(), rng.Int64N(1<<30), str(), ints()))
			}
		}
		if rng.IntN(2) == 0 {
			w.Transform = expr(3)
		}
		if rng.IntN(3) == 0 {
			w.Data = &Location{File: rng.IntN(3), Offset: rng.Int64(), Length: rng.Int64()}
		}
		want, err := json.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendWeight(nil, &w); string(got) != string(want) {
			t.Fatalf("weight %d: encoded\n%s\nwant\n%s", i, got, want)
		}
		packed := w // as a table holds it once lowered
		packed.Transform, packed.packed = nil, w.Transform.Pack(func(k string) string { return k })
		if got := appendWeight(nil, &packed); string(got) != string(want) {
			t.Fatalf("weight %d packed: encoded\n%s\nwant\n%s", i, got, want)
		}
		if w.Transform != nil && packed.Expr().Digest() != w.Transform.Digest() {
			t.Fatalf("weight %d: unpacked %s, want %s", i, packed.Expr(), w.Transform)
		}
	}
	spec := &Spec{Format: SpecFormat, Version: SpecVersion, Mode: Reference, Files: []File{{Path: "checkpoint/a.safetensors", Kind: KindCheckpoint}},
		Weights: []Weight{{Name: "a", DType: "float32", Shape: []int64{2}, Sources: []Source{NewSource("a", 0, 0, 0, "", []int64{2})}, Transform: transform.Cast(transform.Leaf("a"), "float32")}}}
	for _, s := range []*Spec{spec, {Format: SpecFormat}, {Format: SpecFormat, Weights: []Weight{}}} {
		compact, err := s.Compact()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(s)
		if compact != string(want) {
			t.Errorf("Compact gives\n%s\nwant\n%s", compact, want)
		}
	}
}
