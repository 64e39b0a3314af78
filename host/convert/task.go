package convert

import "fmt"

// Task is one of Count scheduler tasks (a Kubernetes Indexed Job's pod, a
// Slurm array task) sharing one conversion: task Index converts its share
// of the decoder layers into the shared directory, and a later --finalize
// run writes the rest. Index is 0-based.
type Task struct{ Index, Count int }

func (t Task) String() string { return fmt.Sprintf("task %d of %d", t.Index, t.Count) }

// share is task t's contiguous run of layers: the layers split into Count
// runs in order, the first len%Count runs one layer longer. Contiguous runs
// keep each task's reads in few shards; a task past the last layer (more
// tasks than layers) has none.
func (t Task) share(layers []int) []int {
	n, k := len(layers), t.Count
	from := t.Index*(n/k) + min(t.Index, n%k)
	size := n / k
	if t.Index < n%k {
		size++
	}
	return layers[from : from+size]
}
