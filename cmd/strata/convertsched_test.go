package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
)

// docBlock is the fenced code between <!-- begin NAME --> and
// <!-- end NAME --> in docs/convert.md.
func docBlock(t *testing.T, name string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(testbin.Root(), "docs", "convert.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- begin "+name+" -->\n")
	block, _, ok2 := strings.Cut(rest, "<!-- end "+name+" -->")
	if !ok || !ok2 {
		t.Fatalf("docs/convert.md has no %s block", name)
	}
	lines := strings.Split(strings.TrimSpace(block), "\n")
	return strings.Join(lines[1:len(lines)-1], "\n") + "\n" // without the fences
}

// checkSchedulerRecipe runs task(i), a command of the docs, for each task,
// then finalize, and checks the directory is what one plain convert writes.
func checkSchedulerRecipe(t *testing.T, src, out string, tasks int, task func(i int) *exec.Cmd, finalize *exec.Cmd) {
	t.Helper()
	for i := range tasks {
		cmd := task(i)
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("task %d: %v\n%s", i, err, msg)
		} else if !strings.Contains(string(msg), "task "+strconv.Itoa(i)+" of "+strconv.Itoa(tasks)) {
			t.Errorf("task %d does not say which task it ran:\n%s", i, msg)
		}
		if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err == nil {
			t.Fatalf("task %d finalized: only --finalize may write the index", i)
		}
	}
	if msg, err := finalize.CombinedOutput(); err != nil {
		t.Fatalf("finalize: %v\n%s", err, msg)
	}
	ref := filepath.Join(t.TempDir(), "ref")
	if msg, err := exec.Command(strataBin, "convert", src, "--out", ref, "--quantize", "fp8-block").CombinedOutput(); err != nil {
		t.Fatalf("plain convert: %v\n%s", err, msg)
	}
	sameFiles(t, testbin.HashTree(t, out), testbin.HashTree(t, ref))
}

// The Kubernetes Indexed Job of docs/convert.md: its container command run
// once per completion index, then the finalize Job's.
func TestKubernetesRecipeMatchesOneConvert(t *testing.T) {
	t.Parallel()
	manifest := docBlock(t, "k8s")
	commands := regexp.MustCompile(`(?m)^\s*command: (\[.*\])$`).FindAllStringSubmatch(manifest, -1)
	completions := regexp.MustCompile(`(?m)^\s*completions: (\d+)$`).FindStringSubmatch(manifest)
	if len(commands) != 2 || completions == nil {
		t.Fatalf("the manifest should hold two Jobs' commands and a completions count:\n%s", manifest)
	}
	n, _ := strconv.Atoi(completions[1])
	src, out := bigLlama(t, 7, 1), filepath.Join(t.TempDir(), "out")
	argv := func(i int) []string {
		var args []string
		if err := json.Unmarshal([]byte(commands[i][1]), &args); err != nil || args[0] != "strata" {
			t.Fatalf("command %s: %v", commands[i][1], err)
		}
		r := strings.NewReplacer("/data/model", src, "/data/out", out)
		for j := range args {
			args[j] = r.Replace(args[j])
		}
		return args[1:]
	}
	if !strings.Contains(commands[0][1], `"--tasks", "`+completions[1]+`"`) {
		t.Errorf("--tasks differs from completions %d: %s", n, commands[0][1])
	}
	checkSchedulerRecipe(t, src, out, n, func(i int) *exec.Cmd {
		cmd := exec.Command(strataBin, argv(0)...)
		cmd.Env = append(withoutSchedulerEnv(os.Environ()), "JOB_COMPLETION_INDEX="+strconv.Itoa(i))
		return cmd
	}, exec.Command(strataBin, argv(1)...))
}

// The Slurm array script of docs/convert.md, run by bash as each array task
// (SLURM_ARRAY_* as Slurm sets them for --array=0-(N-1)), then as the
// finalize job, strata on its PATH.
func TestSlurmRecipeMatchesOneConvert(t *testing.T) {
	t.Parallel()
	script := filepath.Join(t.TempDir(), "convert.sbatch")
	body := docBlock(t, "slurm")
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	array := regexp.MustCompile(`(?m)^#SBATCH --array=0-(\d+)$`).FindStringSubmatch(body)
	if array == nil {
		t.Fatalf("the script has no #SBATCH --array=0-N:\n%s", body)
	}
	last, _ := strconv.Atoi(array[1])
	src, out := bigLlama(t, 7, 1), filepath.Join(t.TempDir(), "out")
	env := append(withoutSchedulerEnv(os.Environ()), "PATH="+filepath.Dir(strataBin)+string(os.PathListSeparator)+os.Getenv("PATH"), "MODEL="+src, "OUT="+out)
	bash := func(args ...string) *exec.Cmd {
		cmd := exec.Command("bash", append([]string{script}, args...)...)
		cmd.Env = env
		return cmd
	}
	checkSchedulerRecipe(t, src, out, last+1, func(i int) *exec.Cmd {
		cmd := bash()
		cmd.Env = append(cmd.Env, "SLURM_ARRAY_TASK_ID="+strconv.Itoa(i), "SLURM_ARRAY_TASK_MIN=0", "SLURM_ARRAY_TASK_MAX="+array[1],
			"SLURM_ARRAY_TASK_STEP=1", "SLURM_ARRAY_TASK_COUNT="+strconv.Itoa(last+1), "SLURM_CPUS_PER_TASK=2")
		return cmd
	}, bash("finalize"))
}

// Outside a scheduler, --layers auto is refused before anything is written.
func TestLayersAutoOutsideASchedulerIsRefused(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	for _, args := range [][]string{{"--layers", "auto"}, {"--layers", "auto", "--tasks", "2"}, {"--layers", "0-1", "--tasks", "2"}, {"--tasks", "0", "--layers", "auto"}} {
		cmd := exec.Command(strataBin, append([]string{"convert", tinyLlama, "--out", out}, args...)...)
		cmd.Env = withoutSchedulerEnv(os.Environ())
		msg, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); err == nil || code != 2 || !strings.Contains(string(msg), "--") {
			t.Errorf("%v: exit %d, %s", args, code, msg)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v: created %s", args, out)
		}
	}
}

func withoutSchedulerEnv(env []string) []string {
	return withoutEnv(env, "JOB_COMPLETION_INDEX=", "SLURM_ARRAY_")
}
