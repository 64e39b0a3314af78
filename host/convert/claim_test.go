package convert

import (
	"slices"
	"testing"
)

// Layers map to lock bytes (the tail at 0, layer l at l+1) in runs, and
// back to the words of a refusal.
func TestLayerLockBytes(t *testing.T) {
	for _, tc := range []struct {
		layers []int
		runs   [][2]int64
		say    string
	}{
		{[]int{-1, 0, 1, 2}, [][2]int64{{0, 4}}, "layers 0-2 and the tail"},
		{[]int{5}, [][2]int64{{6, 7}}, "layer 5"},
		{[]int{-1}, [][2]int64{{0, 1}}, "the tail"},
		{[]int{0, 1, 3, 4, 7}, [][2]int64{{1, 3}, {4, 6}, {8, 9}}, "layers 0-1"},
	} {
		runs := byteRuns(tc.layers)
		if !slices.Equal(runs, tc.runs) {
			t.Errorf("%v: runs %v, want %v", tc.layers, runs, tc.runs)
		}
		if got := describeBytes(runs[0][0], runs[0][1]); got != tc.say {
			t.Errorf("%v: %q, want %q", tc.layers, got, tc.say)
		}
	}
}
