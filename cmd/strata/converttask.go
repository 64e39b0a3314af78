package main

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/strata-llm/strata/host/convert"
)

// The environment variables schedulers set in each task of an array job.
const (
	envK8sIndex   = "JOB_COMPLETION_INDEX"   // Kubernetes Indexed Job: 0..completions-1
	envSlurmID    = "SLURM_ARRAY_TASK_ID"    // Slurm array: the task's index as --array lists it
	envSlurmCount = "SLURM_ARRAY_TASK_COUNT" // how many tasks the array has
	envSlurmMin   = "SLURM_ARRAY_TASK_MIN"   // --array's first index (1 in --array=1-8)
	envSlurmStep  = "SLURM_ARRAY_TASK_STEP"  // --array's step (2 in --array=0-14:2)
)

// schedulerTask is `--layers auto`: which of how many tasks this process
// is, from the scheduler's variables. Kubernetes gives the index only, so
// its count is --tasks (the Job's completions); Slurm gives both, and
// --tasks, when given too, must agree. tasks is 0 when --tasks is not given.
func schedulerTask(getenv func(string) string, tasks int) (convert.Task, error) {
	if v := getenv(envK8sIndex); v != "" {
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 {
			return convert.Task{}, usageError{fmt.Sprintf("--layers auto: %s=%q is not a task index (0, 1, ...)", envK8sIndex, v)}
		}
		if tasks == 0 {
			return convert.Task{}, usageError{fmt.Sprintf("--layers auto: %s=%d gives this pod's index, not how many there are: add --tasks N (the Job's completions)", envK8sIndex, i)}
		}
		return checkTask(convert.Task{Index: i, Count: tasks}, envK8sIndex)
	}
	if v := getenv(envSlurmID); v != "" {
		id, min, step, count, err := slurmInts(getenv)
		if err != nil {
			return convert.Task{}, err
		}
		if count == 0 {
			count = tasks
		}
		if tasks != 0 && count != tasks {
			return convert.Task{}, usageError{fmt.Sprintf("--layers auto: --tasks %d, but the Slurm array has %s=%d tasks: drop --tasks or make them agree", tasks, envSlurmCount, count)}
		}
		if count == 0 {
			return convert.Task{}, usageError{fmt.Sprintf("--layers auto: %s is set but not %s: add --tasks N (the array's size)", envSlurmID, envSlurmCount)}
		}
		if id < min || (id-min)%step != 0 {
			return convert.Task{}, usageError{fmt.Sprintf("--layers auto: %s=%d is not in the array %d, %d, ... (%s, %s): use a plain --array=0-%d", envSlurmID, id, min, min+step, envSlurmMin, envSlurmStep, count-1)}
		}
		return checkTask(convert.Task{Index: (id - min) / step, Count: count}, envSlurmID)
	}
	return convert.Task{}, usageError{fmt.Sprintf("--layers auto: neither %s (a Kubernetes Indexed Job) nor %s (a Slurm array) is set: run it as a scheduler task, or give --layers FIRST-LAST", envK8sIndex, envSlurmID)}
}

// slurmInts reads the array task's id, the array's first index and step
// (defaults 0 and 1), and its task count (0 when unset).
func slurmInts(getenv func(string) string) (id, min, step, count int, err error) {
	step = 1
	for _, f := range []struct {
		name string
		dst  *int
		low  int
	}{{envSlurmID, &id, 0}, {envSlurmMin, &min, 0}, {envSlurmStep, &step, 1}, {envSlurmCount, &count, 1}} {
		v := getenv(f.name)
		if v == "" {
			continue
		}
		n, convErr := strconv.Atoi(v)
		if convErr != nil || n < f.low {
			return 0, 0, 0, 0, usageError{fmt.Sprintf("--layers auto: %s=%q is not a whole number ≥ %d", f.name, v, f.low)}
		}
		*f.dst = n
	}
	return id, min, step, count, nil
}

func checkTask(t convert.Task, from string) (convert.Task, error) {
	if t.Index >= t.Count {
		return convert.Task{}, usageError{fmt.Sprintf("--layers auto: %s=%d is past the last of %d tasks (0-%d): --tasks must be the number of tasks", from, t.Index, t.Count, t.Count-1)}
	}
	return t, nil
}

// layerList writes a task's layers as "4-7", or "none" when there are more
// tasks than layers.
func layerList(layers []int) string {
	if len(layers) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d-%d", slices.Min(layers), slices.Max(layers))
}
