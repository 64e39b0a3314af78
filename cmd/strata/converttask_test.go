package main

import (
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/convert"
)

func TestSchedulerTask(t *testing.T) {
	cases := map[string]struct {
		env   map[string]string
		tasks int
		want  convert.Task
		err   string
	}{
		"kubernetes":                    {env: map[string]string{"JOB_COMPLETION_INDEX": "2"}, tasks: 4, want: convert.Task{Index: 2, Count: 4}},
		"kubernetes without --tasks":    {env: map[string]string{"JOB_COMPLETION_INDEX": "2"}, err: "add --tasks N"},
		"kubernetes past the last task": {env: map[string]string{"JOB_COMPLETION_INDEX": "4"}, tasks: 4, err: "past the last of 4 tasks"},
		"kubernetes not a number":       {env: map[string]string{"JOB_COMPLETION_INDEX": "x"}, tasks: 4, err: `JOB_COMPLETION_INDEX="x" is not a task index`},
		"slurm":                         {env: map[string]string{"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}, want: convert.Task{Index: 3, Count: 4}},
		"slurm from 1":                  {env: map[string]string{"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, want: convert.Task{Index: 0, Count: 4}},
		"slurm with a step":             {env: map[string]string{"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "3"}, want: convert.Task{Index: 2, Count: 3}},
		"slurm off the step":            {env: map[string]string{"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "3"}, err: "is not in the array"},
		"slurm --tasks agrees":          {env: map[string]string{"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2"}, tasks: 2, want: convert.Task{Index: 0, Count: 2}},
		"slurm --tasks disagrees":       {env: map[string]string{"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2"}, tasks: 3, err: "make them agree"},
		"slurm without a count":         {env: map[string]string{"SLURM_ARRAY_TASK_ID": "0"}, err: "add --tasks N"},
		"slurm count from --tasks":      {env: map[string]string{"SLURM_ARRAY_TASK_ID": "1"}, tasks: 2, want: convert.Task{Index: 1, Count: 2}},
		"slurm bad count":               {env: map[string]string{"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "0"}, err: "SLURM_ARRAY_TASK_COUNT=\"0\" is not a whole number ≥ 1"},
		"kubernetes wins over slurm":    {env: map[string]string{"JOB_COMPLETION_INDEX": "1", "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "9"}, tasks: 2, want: convert.Task{Index: 1, Count: 2}},
		"no scheduler":                  {env: map[string]string{}, tasks: 2, err: "neither JOB_COMPLETION_INDEX (a Kubernetes Indexed Job) nor SLURM_ARRAY_TASK_ID"},
	}
	for name, tc := range cases {
		got, err := schedulerTask(func(k string) string { return tc.env[k] }, tc.tasks)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !isUsageError(err)):
			t.Errorf("%s: %v, want a usage error with %q", name, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %+v %v, want %+v", name, got, err, tc.want)
		}
	}
}
