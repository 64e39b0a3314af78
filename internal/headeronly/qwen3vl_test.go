package headeronly

import (
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
)

// TestQwen3VL_235B writes the Qwen3-VL-235B-A22B config (BF16, fused experts
// [E, H, 2I] / [E, I, H] as the release stores them, 5 GB shards): 1,388
// tensors in 96 shards, 235,670,022,896 parameters, vision tower included.
func TestQwen3VL_235B(t *testing.T) {
	config := readConfig(t, "qwen3-vl-235b-a22b")
	tensors, err := Tensors(config, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	const vision = 3 + 27*12 + 6 + 3*6 // patch embed, pos table, blocks, merger, DeepStack mergers
	const perLayer = 4 + 2 + 3 + 2     // attention, q/k norms, fused experts + router, layer norms
	wantTensors, params := vision+3+94*perLayer, int64(235_670_022_896)
	const fiveGB = 5_000_000_000
	dir := t.TempDir()
	st, err := Write(dir, config, tensors, fiveGB)
	if err != nil {
		t.Fatal(err)
	}
	if st.Tensors != wantTensors || st.TensorBytes != 2*params || st.Shards != 96 {
		t.Errorf("Stats = %+v, want %d tensors in 96 shards, %d tensor bytes", st, wantTensors, 2*params)
	}
	c, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkOpened(t, c, st, wantTensors, params)
	checkShardLimit(t, c, tensors, fiveGB)
	checkSparse(t, c, st)
	for _, tc := range []struct {
		key   string
		shape []int64
	}{{"model.language_model.layers.93.mlp.experts.gate_up_proj", []int64{128, 4096, 3072}},
		{"model.language_model.layers.0.mlp.experts.down_proj", []int64{128, 1536, 4096}},
		{"model.visual.patch_embed.proj.weight", []int64{1152, 3, 2, 16, 16}},
		{"model.visual.deepstack_merger_list.2.linear_fc1.weight", []int64{4608, 4608}}} {
		found := false
		for _, x := range tensors {
			if x.Name == tc.key {
				found = true
				if len(x.Shape) != len(tc.shape) || x.Shape[len(x.Shape)-1] != tc.shape[len(tc.shape)-1] || x.Shape[0] != tc.shape[0] {
					t.Errorf("%s: shape %v, want %v", tc.key, x.Shape, tc.shape)
				}
			}
		}
		if !found {
			t.Errorf("%s missing", tc.key)
		}
	}
}
