package convert

import (
	"fmt"
	"slices"
	"testing"
)

// Every layer goes to exactly one task, in order, the shares differing by
// at most one layer.
func TestTaskSharesCoverTheLayersOnce(t *testing.T) {
	for _, tc := range []struct{ layers, tasks int }{{2, 1}, {2, 2}, {2, 3}, {7, 3}, {48, 4}, {94, 8}, {5, 5}, {1, 4}} {
		layers := make([]int, tc.layers)
		for i := range layers {
			layers[i] = i
		}
		var all []int
		lo, hi := tc.layers, 0
		for i := range tc.tasks {
			s := Task{Index: i, Count: tc.tasks}.share(layers)
			all = append(all, s...)
			lo, hi = min(lo, len(s)), max(hi, len(s))
		}
		if !slices.Equal(all, layers) || hi-lo > 1 {
			t.Errorf("%d layers over %d tasks: %v (shares %d to %d layers)", tc.layers, tc.tasks, all, lo, hi)
		}
	}
	if got := fmt.Sprint(Task{Index: 1, Count: 3}.share([]int{0, 1, 2, 3, 4, 5, 6})); got != "[3 4]" {
		t.Errorf("task 1 of 3 over 7 layers: %s, want [3 4]", got)
	}
}
