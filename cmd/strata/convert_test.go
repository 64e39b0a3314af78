package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/internal/testbin"
)

// bigLlama writes a Llama-shaped checkpoint of layers × ~mb MB of float32
// (hidden 1024), big enough that a conversion can be interrupted midway.
func bigLlama(t *testing.T, layers, mb int) string {
	t.Helper()
	dir := t.TempDir()
	const h = 1024
	rows := int64(mb << 20 / (4 * h * 2))
	entries := []checkpoint.Entry{{Name: "model.embed_tokens.weight", DType: "F32", Shape: []int64{256, h}}, {Name: "model.norm.weight", DType: "F32", Shape: []int64{h}}}
	for i := range layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		entries = append(entries,
			checkpoint.Entry{Name: p + "input_layernorm.weight", DType: "F32", Shape: []int64{h}},
			checkpoint.Entry{Name: p + "mlp.down_proj.weight", DType: "F32", Shape: []int64{h, rows}},
			checkpoint.Entry{Name: p + "mlp.up_proj.weight", DType: "F32", Shape: []int64{rows, h}})
	}
	w, err := checkpoint.CreateSafetensors(filepath.Join(dir, "model.safetensors"), entries)
	if err != nil {
		t.Fatal(err)
	}
	seed := uint32(1)
	for _, e := range entries {
		n := int64(1)
		for _, d := range e.Shape {
			n *= d
		}
		buf := make([]byte, 4*n)
		for i := range n {
			seed = seed*1664525 + 1013904223
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(float32(int32(seed))/float32(1<<31)))
		}
		if err := w.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"model_type": "llama", "num_hidden_layers": layers, "tie_word_embeddings": true})
	os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644)
	return dir
}

func sameFiles(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s differs or is missing", k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("extra file %s", k)
		}
	}
}

func TestConvertCommand(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, stderr := strata(t, "convert", tinyLlama, "--out", out, "--dtype", "float16", "--quantize", "fp8-block", "-j", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"2 of 2 layers written", "source tensors", "quantization_config excludes"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	// Not a terminal: one plain progress line per layer.
	if !strings.Contains(stderr, "layer 0 written") || !strings.Contains(stderr, "ETA") || strings.Contains(stderr, "\r") {
		t.Errorf("progress lines:\n%q", stderr)
	}
	for _, f := range []string{"model-layer-00000.safetensors", "model-layer-00001.safetensors", "model-tail.safetensors", "model.safetensors.index.json", "config.json", "convert-report.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	// Again: everything kept.
	code, stdout, _ = strata(t, "convert", tinyLlama, "--out", out, "--dtype", "float16", "--quantize", "fp8-block")
	if code != 0 || !strings.Contains(stdout, "0 of 2 layers written by this run, 2 already present") {
		t.Errorf("re-run: %d %s", code, stdout)
	}
}

func TestConvertCommandErrors(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--layers", "3-1"}, 2, "give FIRST-LAST"},
		{[]string{"--layers", "0-7"}, 1, "outside the model"},
		{[]string{"--dtype", "int4"}, 2, "use bfloat16, float16 or float32"},
		{[]string{"--finalize"}, 1, "missing layers 0-1"},
	}
	for _, tc := range cases {
		code, _, stderr := strata(t, append([]string{"convert", tinyLlama, "--out", out}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %s", tc.args, code, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err == nil {
		t.Error("index written by a failed run")
	}
}

// TestConvertSurvivesKill9 kills strata convert at several points; each
// re-run completes the directory to exactly what one uninterrupted run writes.
func TestConvertSurvivesKill9(t *testing.T) {
	t.Parallel()
	src := bigLlama(t, 6, 16)
	args := []string{"--dtype", "bfloat16", "--quantize", "fp8-dynamic", "-j", "2"}
	ref := filepath.Join(t.TempDir(), "ref")
	if code, _, stderr := strata(t, append([]string{"convert", src, "--out", ref}, args...)...); code != 0 {
		t.Fatal(stderr)
	}
	want := testbin.HashTree(t, ref)
	out := filepath.Join(t.TempDir(), "out")
	for _, after := range []time.Duration{50 * time.Millisecond, 1500 * time.Millisecond, 1500 * time.Millisecond, 2500 * time.Millisecond} {
		cmd := exec.Command(strataBin, append([]string{"convert", src, "--out", out}, args...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(after)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}
	code, stdout, stderr := strata(t, append([]string{"convert", src, "--out", out}, args...)...)
	if code != 0 {
		t.Fatalf("resume: exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "already present") || strings.Contains(stdout, " 0 already present") {
		t.Logf("no layer survived the kills (slow machine?): %s", stdout)
	}
	sameFiles(t, testbin.HashTree(t, out), want)
}

// TestConvertCtrlCStopsWithinASecond interrupts a running conversion; it
// exits promptly, writes no index, says how to resume, and the re-run
// completes it.
func TestConvertCtrlCStopsWithinASecond(t *testing.T) {
	t.Parallel()
	src := bigLlama(t, 8, 24)
	out := filepath.Join(t.TempDir(), "out")
	args := []string{"convert", src, "--out", out, "--quantize", "fp8-block", "-j", "1"}
	cmd := exec.Command(strataBin, args...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.Contains(sc.Text(), "layer 0 written") {
			break
		}
	}
	start := time.Now()
	cmd.Process.Signal(os.Interrupt)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	err := cmd.Wait()
	took := time.Since(start)
	// Within a second on an idle machine (docs); the tests run in
	// parallel, so allow a loaded one twice that.
	if took > 2*time.Second {
		t.Errorf("took %v to stop after Ctrl-C", took)
	}
	all := strings.Join(lines, "\n")
	if code := cmd.ProcessState.ExitCode(); err == nil || code != 130 {
		if strings.Contains(all, "8 of 8 layers") {
			t.Skip("finished before the interrupt")
		}
		t.Errorf("exit %d after Ctrl-C:\n%s", code, all)
	}
	if !strings.Contains(all, "run the same command again to resume") {
		t.Errorf("no resume hint:\n%s", all)
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err == nil {
		t.Error("index written by an interrupted run")
	}
	if code, stdout, stderr := strata(t, args...); code != 0 || !strings.Contains(stdout, "already present") {
		t.Errorf("resume: %d %s %s", code, stdout, stderr)
	}
}

// TestConvertFullDiskFailsClearlyAndResumes runs strata under a file-size
// limit (writes fail as on a full disk): a clear error, no index, and once
// there is room the same command completes the directory.
func TestConvertFullDiskFailsClearlyAndResumes(t *testing.T) {
	t.Parallel()
	src := bigLlama(t, 2, 4)
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command("sh", "-c", `ulimit -f 2048 && exec "$0" convert "$1" --out "$2" --dtype float16`, strataBin, src, out)
	msg, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("convert under a 1 MB file-size limit succeeded:\n%s", msg)
	}
	if !strings.Contains(string(msg), "file too large") || !strings.Contains(string(msg), "free space") {
		t.Errorf("error does not say what is wrong and what to do:\n%s", msg)
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err == nil {
		t.Error("index written by a failed run")
	}
	if code, _, stderr := strata(t, "convert", src, "--out", out, "--dtype", "float16"); code != 0 {
		t.Fatalf("re-run with room: %s", stderr)
	}
	ref := filepath.Join(t.TempDir(), "ref")
	strata(t, "convert", src, "--out", ref, "--dtype", "float16")
	sameFiles(t, testbin.HashTree(t, out), testbin.HashTree(t, ref))
}

// Runs of --layers with other options into one directory, one after the
// other or starting at once, are refused, naming both runs' options: never
// a checkpoint of mixed dtypes (issue 30).
func TestConvertLayersWithOtherOptionsRefused(t *testing.T) {
	t.Parallel()
	plugins := ownPlugins(t, llamaDir)
	for _, tc := range []struct {
		name   string
		rounds int
		atOnce bool
	}{
		{"one after the other", 1, false},
		{"at once", 8, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range tc.rounds {
				out := filepath.Join(t.TempDir(), "out")
				runs := []*exec.Cmd{
					exec.Command(strataBin, "convert", tinyLlama, "--out", out, "--plugin-dir", plugins, "--layers", "0-0", "--dtype", "float16"),
					exec.Command(strataBin, "convert", tinyLlama, "--out", out, "--plugin-dir", plugins, "--layers", "1-1", "--dtype", "float32"),
				}
				stderr := make([]strings.Builder, len(runs))
				for i, c := range runs {
					c.Stderr = &stderr[i]
					must(t, c.Start())
					if !tc.atOnce {
						c.Wait()
					}
				}
				ok := 0
				for i, c := range runs {
					if c.Wait(); c.ProcessState.ExitCode() == 0 {
						ok++
					} else if msg := stderr[i].String(); !strings.Contains(msg, "--dtype float16") || !strings.Contains(msg, "--dtype float32") {
						t.Errorf("round %d: the refusal does not name both runs' options:\n%s", round, msg)
					}
				}
				if ok != 1 {
					t.Fatalf("round %d: %d of the runs succeeded, want 1:\n%s\n%s", round, ok, stderr[0].String(), stderr[1].String())
				}
			}
			requireNoProcesses(t, plugins)
		})
	}
}
