package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strata-llm/strata/host/convert"
	"github.com/strata-llm/strata/internal/testbin"
)

// The data items of issue 30 left to convert and convert-bin: hostile
// archives (duplicate entries, amplification), views, names that are not
// UTF-8. Each runs in TestCatalogue: the source and everything outside the
// output byte- and inode-identical, a refusal writing nothing.
func dataCases() []catalogueCase {
	var cases []catalogueCase
	add := func(c catalogueCase) { cases = append(cases, c) }
	// binScene writes archive as root/bin/pytorch_model.bin with a config.
	binScene := func(t *testing.T, root string, archive []byte, flags ...string) scene {
		src := filepath.Join(root, "bin")
		put(t, filepath.Join(src, "config.json"), `{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}`)
		must(t, os.WriteFile(filepath.Join(src, "pytorch_model.bin"), archive, 0o644))
		out := filepath.Join(root, "out")
		return scene{args: append([]string{"convert-bin", src, "--out", out}, flags...), out: out}
	}
	one := []testbin.TorchView{{Key: "w", Storage: "0", Shape: []int64{2}, Stride: []int64{1}}}
	two := map[string][]byte{"0": testbin.Float32s(1, 2)}
	add(catalogueCase{name: "convert-bin: two archive/data.pkl entries", want: `holds "archive/data.pkl" twice`, setup: func(t *testing.T, root, plugins string) scene {
		return binScene(t, root, testbin.TorchSave(one, two, testbin.ZipEntry{Name: "data.pkl", Data: []byte("\x80\x02}.")}))
	}})
	add(catalogueCase{name: "convert-bin: a storage twice", want: `holds "archive/data/0" twice`, setup: func(t *testing.T, root, plugins string) scene {
		return binScene(t, root, testbin.TorchSave(one, two, testbin.ZipEntry{Name: "data/0", Data: testbin.Float32s(6, 6)}))
	}})
	add(catalogueCase{name: "convert-bin: broadcast, overlapping and transposed views", setup: func(t *testing.T, root, plugins string) scene {
		views := []testbin.TorchView{
			{Key: "broadcast", Storage: "0", Shape: []int64{3, 2}, Stride: []int64{0, 1}},
			{Key: "overlap", Storage: "0", Shape: []int64{3, 2}, Stride: []int64{1, 1}, Offset: 1},
			{Key: "transposed", Storage: "0", Shape: []int64{2, 3}, Stride: []int64{1, 2}},
		}
		s := binScene(t, root, testbin.TorchSave(views, map[string][]byte{"0": testbin.Float32s(0, 1, 2, 3, 4, 5)}))
		s.check = func(t *testing.T) { mustExist(t, filepath.Join(s.out, "model.safetensors")) }
		return s
	}})
	// 200,000 keys over one 4 KiB storage: 800 MB of output from 4 kB.
	hostile := func() []byte {
		views := make([]testbin.TorchView, 200_000)
		for i := range views {
			views[i] = testbin.TorchView{Key: fmt.Sprintf("model.layers.%d.w", i), Storage: "0", Shape: []int64{1024}, Stride: []int64{1}}
		}
		return testbin.TorchSave(views, map[string][]byte{"0": make([]byte, 4096)})
	}
	add(catalogueCase{name: "convert-bin: 200,000 keys sharing one storage", want: "storage 0 (4.1 kB) alone is written 819.2 MB by 200000 tensors", setup: func(t *testing.T, root, plugins string) scene {
		return binScene(t, root, hostile())
	}})
	add(catalogueCase{name: "export --bin-to: 200,000 keys sharing one storage", want: "strata convert-bin --max-amplification 200000", setup: func(t *testing.T, root, plugins string) scene {
		s := binScene(t, root, hostile())
		return exportScene(filepath.Join(root, "bin"), filepath.Join(root, "exp"), plugins, "--bin-to", s.out)
	}})
	shared := func(n int) []byte {
		views := make([]testbin.TorchView, n)
		for i := range views {
			views[i] = testbin.TorchView{Key: fmt.Sprintf("t%d", i), Storage: "0", Shape: []int64{2}, Stride: []int64{1}}
		}
		return testbin.TorchSave(views, two)
	}
	add(catalogueCase{name: "convert-bin: six keys sharing one storage", want: "(6.0×, more than the 4× strata allows)", setup: func(t *testing.T, root, plugins string) scene {
		return binScene(t, root, shared(6))
	}})
	add(catalogueCase{name: "convert-bin --max-amplification 6: six keys sharing one storage", setup: func(t *testing.T, root, plugins string) scene {
		return binScene(t, root, shared(6), "--max-amplification", "6")
	}})
	add(catalogueCase{name: "convert-bin: a key that is not UTF-8", want: `tensor name "t\xff" is not valid UTF-8`, setup: func(t *testing.T, root, plugins string) scene {
		return binScene(t, root, testbin.TorchSave([]testbin.TorchView{{Key: "t\xff", Storage: "0", Shape: []int64{2}, Stride: []int64{1}}}, two))
	}})
	for _, cmd := range []string{"convert", "export"} {
		add(catalogueCase{name: cmd + ": a tensor name that is not UTF-8", want: `tensor name "model.no\xffm.weight" is not valid UTF-8 (byte 0xff at offset 8)`, setup: func(t *testing.T, root, plugins string) scene {
			src := tiny(t, filepath.Join(root, "src"))
			shard := filepath.Join(src, "model.safetensors")
			data, err := os.ReadFile(shard)
			must(t, err)
			must(t, os.WriteFile(shard, bytes.Replace(data, []byte(`"model.norm.weight"`), []byte("\"model.no\xffm.weight\""), 1), 0o644))
			out := filepath.Join(root, "out")
			return scene{args: []string{cmd, src, "--out", out, "--plugin-dir", plugins}, out: out}
		}})
	}
	return cases
}

// An empty value is no value: --out "" names no directory and --layers ""
// no layers; each is a usage error (exit 2) that says what the flag takes,
// and nothing is written (issue 30: --layers "" converted and finalized
// the whole model, --out "" exited 1).
func TestEmptyValuesExitTwo(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	src := tiny(t, filepath.Join(root, "src"))
	before := tree(t, root, "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"convert", src, "--out", filepath.Join(root, "out"), "--layers", ""}, `--layers "": give FIRST-LAST`},
		{[]string{"convert", src, "--out", ""}, `--out "": no output directory; pass --out DIR`},
		{[]string{"export", src, "--out", ""}, `--out "": no output directory`},
		{[]string{"compile", src, "--out", "", "--dry-run"}, `--out "": no output directory`},
		{[]string{"convert-bin", src, "--out", ""}, `--out "": no output directory`},
		{[]string{"convert-bin", src, "--out", filepath.Join(root, "out"), "--max-amplification", "0"}, "--max-amplification 0: give a factor of at least 1"},
	} {
		code, _, stderr := strata(t, append(tc.args, "--plugin-dir", llamaDir)...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d, want 2 saying %s:\n%s", tc.args, code, tc.want, stderr)
		}
	}
	sameTree(t, before, tree(t, root, ""))
}

// Two identical converts at once: one converts, the other is refused up
// front saying which process holds which layers and through which lock,
// never "no such file or directory" from the two removing each other's
// files (issue 30); the result is one complete conversion.
func TestConcurrentConvertsSayWhoHoldsTheLayers(t *testing.T) {
	t.Parallel()
	src := bigLlama(t, 4, 8)
	root := t.TempDir()
	outside := tree(t, src, "")
	for round := range 3 {
		out := filepath.Join(root, fmt.Sprint(round))
		var wg sync.WaitGroup
		var stderr [2]bytes.Buffer
		var codes [2]int
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(strataBin, "convert", src, "--out", out, "--dtype", "bfloat16", "-j", "1")
				cmd.Stderr = &stderr[i]
				cmd.Run()
				codes[i] = cmd.ProcessState.ExitCode()
			}()
		}
		wg.Wait()
		for i := range 2 {
			msg := stderr[i].String()
			if strings.Contains(msg, "no such file") || codes[i] != 0 && !strings.Contains(msg, "is converting") {
				t.Errorf("round %d, run %d: exit %d:\n%s", round, i, codes[i], msg)
			}
			if codes[i] != 0 && !(strings.Contains(msg, "another strata process (pid ") && strings.Contains(msg, convert.LayersLock)) {
				t.Errorf("round %d, run %d: the refusal names no pid or lock:\n%s", round, i, msg)
			}
		}
		t.Logf("round %d: exit codes %v", round, codes)
		if codes[0] != 0 && codes[1] != 0 {
			t.Errorf("round %d: both refused", round)
		}
		mustExist(t, filepath.Join(out, convert.IndexFile))
	}
	sameTree(t, outside, tree(t, src, ""))

	// Deterministically: the layers held by another process (this test)
	// are named with its pid; other layers convert meanwhile, and
	// finalizing waits for the holder.
	out := filepath.Join(root, "held")
	run := func(args ...string) (int, string) {
		cmd := exec.Command(strataBin, append([]string{"convert", src, "--out", out, "--dtype", "bfloat16"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		cmd.Run()
		return cmd.ProcessState.ExitCode(), stderr.String()
	}
	if code, msg := run("--layers", "3"); code != 0 {
		t.Fatal(msg)
	}
	lock, err := os.OpenFile(filepath.Join(out, convert.LayersLock), os.O_RDWR, 0)
	must(t, err)
	defer lock.Close()
	must(t, unix.FcntlFlock(lock.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_WRLCK, Start: 1, Len: 2})) // layers 0-1
	want := fmt.Sprintf("another strata process (pid %d) is converting layers 0-1 into it (it holds their lock in %s)", os.Getpid(), convert.LayersLock)
	if code, msg := run("--layers", "0-2"); code != 1 || !strings.Contains(msg, want) {
		t.Errorf("--layers 0-2 while 0-1 are held: exit %d, want %q:\n%s", code, want, msg)
	}
	if code, msg := run("--layers", "2"); code != 0 {
		t.Errorf("--layers 2 while 0-1 are held: %s", msg)
	}
	start := time.Now()
	if code, msg := run("--finalize"); code != 1 || !strings.Contains(msg, "cannot finalize yet") || !strings.Contains(msg, "layers 0-1 into it") || !strings.Contains(msg, "run --finalize again once it has finished") {
		t.Errorf("--finalize while layers 0-1 are held: exit %d:\n%s", code, msg)
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("the refusal took %v", time.Since(start))
	}
	lock.Close()
	if code, msg := run("--layers", "0-1", "--finalize"); code != 0 {
		t.Errorf("after the holder went: %s", msg)
	}
	mustExist(t, filepath.Join(out, convert.IndexFile))
}
