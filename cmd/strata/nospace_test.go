package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/strata-llm/strata/internal/testbin"
)

// --weights materialize of more than the output's file system has free is
// refused before the first byte, saying how much it needs and has; a
// previous export in --out is left as it was.
func TestMaterializeRefusedWithoutRoom(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	ckpt, layers := roomlessLlama(t, root, 4)
	out := filepath.Join(root, "out")
	if code, _, errOut := strata(t, "export", ckpt, "--out", out, "--plugin-dir", llamaDir); code != 0 {
		t.Fatalf("the weight-free export: exit %d\n%s", code, errOut)
	}
	before := listing(t, out)
	code, stdout, stderr := strata(t, "export", ckpt, "--out", filepath.Join(root, "dry"), "--plugin-dir", llamaDir, "--weights", "materialize", "--dry-run")
	if want := "do not fit in the "; code != 0 || !strings.Contains(stdout+stderr, want) {
		t.Errorf("--dry-run: exit %d, want 0 and a note saying %q:\n%s%s", code, want, stdout, stderr)
	}
	shardsOverFree, _ := roomlessLlama(t, root, 2) // its BF16 shards alone are twice the free space
	for _, tc := range []struct {
		name, ckpt, out string
		flags           []string
		want            []string // beside "… has X free: free Y there"
	}{
		{"whole, new --out", ckpt, filepath.Join(root, "new"), []string{"--weights=materialize"},
			[]string{"this export would take ", " of materialised weights and the file system of ", "--weights reference"}},
		{"whole, over an export", ckpt, out, []string{"--weights=materialize"},
			[]string{"this export would take ", " of materialised weights and the file system of ", "--weights reference"}},
		{"layerwise, new --out", ckpt, filepath.Join(root, "windows"), []string{"--weights=materialize", "--layerwise", "--keep-windows", fmt.Sprintf("--window-size=%d", layers)},
			[]string{"window_0_" + fmt.Sprint(layers-1) + ".safetensors would take ", " of materialised weights and the file system of ", "--weights reference"}},
		{"--link copy, new --out", shardsOverFree, filepath.Join(root, "copy"), []string{"--link=copy"},
			[]string{"this export would take ", " of copied shards and the file system of ", "--link auto"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := refused(t, append([]string{"export", tc.ckpt, "--out", tc.out, "--plugin-dir", llamaDir}, tc.flags...)...)
			for _, want := range append(tc.want, " has ", " free: free ", "export to another --out") {
				if !strings.Contains(msg, want) {
					t.Errorf("the refusal lacks %q:\n%s", want, msg)
				}
			}
			if tc.out == out {
				if after := listing(t, out); !maps.Equal(before, after) {
					t.Errorf("the refused export changed the previous one in --out:\n%v\n%v", before, after)
				}
			} else if _, err := os.Stat(tc.out); !os.IsNotExist(err) {
				t.Errorf("the refused export left its new --out: %v", err)
			}
		})
	}
}

// listing is each file under dir by its path: its size, modification time
// and inode (what replacing or rewriting it changes), leaving out strata's
// control files as testbin.HashTree does, without reading the
// hundreds of GB of sparse shards linked there.
func listing(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".strata-") {
			return err // strata's control files record each run
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		files[p] = fmt.Sprintf("%d %d.%d %d", st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ino)
		return nil
	}))
	return files
}

// convert of a checkpoint larger than the output's file system has free is
// refused before the first shard, saying how much it needs and has.
func TestConvertRefusedWithoutRoom(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	out := filepath.Join(root, "out")
	src, _ := roomlessLlama(t, root, 2)
	code, stdout, stderr := strata(t, "convert", src, "--out", out, "--dry-run")
	if want := "do not fit in the "; code != 0 || !strings.Contains(stdout+stderr, want) {
		t.Errorf("--dry-run: exit %d, want 0 and a note saying %q:\n%s%s", code, want, stdout, stderr)
	}
	msg := refused(t, "convert", src, "--out", out)
	for _, want := range []string{" shards to write hold ", "and the file system of " + out + " has ", " free: free "} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, msg)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err == nil {
		t.Error("a refused conversion wrote an index")
	}
}

// A write failing as on a full disk (here a file-size limit) while
// materialising says what to do, and the export's new --out is gone.
func TestMaterializeFullDiskSaysWhatToDo(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command("sh", "-c", `ulimit -f 64 && exec "$0" export "$1" --out "$2" --plugin-dir "$3" --weights materialize`, strataBin, tinyLlama, out, llamaDir)
	msg, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("materialising under a 32 kB file-size limit succeeded:\n%s", msg)
	}
	for _, want := range []string{"file too large", "weights/model.safetensors needs ", " in all: make room for that on the file system of " + out, "--weights reference"} {
		if !strings.Contains(string(msg), want) {
			t.Errorf("the error lacks %q:\n%s", want, msg)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("the failed export left its new --out: %v", err)
	}
}

// roomlessLlama is a sparse header-only Llama whose every layer is 855M
// parameters, with enough layers that at bytesPerParam it holds twice what
// root's file system (the test's temporary one) has free; and that number
// of layers.
func roomlessLlama(t *testing.T, root string, bytesPerParam int64) (ckpt string, layers int64) {
	t.Helper()
	var st unix.Statfs_t
	must(t, unix.Statfs(root, &st))
	free := int64(st.Bavail) * int64(st.Bsize)
	const layerParams = 855_638_016 // q, k, v, o and the MLP below
	layers = 2*free/(layerParams*bytesPerParam) + 1
	return headerOnlyLlama(t, llamaShape{hidden: 8192, intermediate: 28672, layers: layers, heads: 64, kvHeads: 8}), layers
}

// llamaShape is what decides a Llama's size.
type llamaShape struct{ hidden, intermediate, layers, heads, kvHeads int64 }

// headerOnlyLlama is a header-only BF16 Llama of shape s (vocabulary
// 32,000), in shards of at most 5 GB.
func headerOnlyLlama(t testing.TB, s llamaShape) string {
	t.Helper()
	config, err := json.Marshal(map[string]any{"model_type": "llama", "architectures": []string{"LlamaForCausalLM"},
		"hidden_size": s.hidden, "intermediate_size": s.intermediate, "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
		"num_key_value_heads": s.kvHeads, "vocab_size": 32000, "rms_norm_eps": 1e-5})
	if err != nil {
		t.Fatal(err)
	}
	return testbin.HeaderOnlyConfig(t, config, 5_000_000_000)
}

// refused runs strata, wanting exit 1 within 30 s (it is killed then: a
// missing check would be filling the disk), and returns its stderr.
func refused(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, strataBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("still running after 30 s (writing?):\n%s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 || err == nil {
		t.Fatalf("exit %d, want 1:\n%s", code, stderr.String())
	}
	return stderr.String()
}
