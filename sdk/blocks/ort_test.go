package blocks

import (
	"testing"

	"github.com/strata-llm/strata/sdk/fn"
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
