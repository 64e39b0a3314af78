package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/strata-llm/strata/host/check"
	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/internal/testbin"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	sameSize := sameSizeShards(t)
	for _, tc := range []struct {
		name    string
		link    string
		src     string // tinyLlama unless set
		tamper  func(t *testing.T, out string)
		code    int
		verdict map[string]bool
		say     string
	}{
		{name: "hard links", link: "hardlink", verdict: map[string]bool{check.ONNXRuntime: true, check.ONNXPackage: false}, say: "hard links"},
		{name: "copies", link: "copy", verdict: map[string]bool{check.ONNXRuntime: true, check.ONNXPackage: true}},
		{name: "symlinks", link: "symlink", verdict: map[string]bool{check.ONNXRuntime: false, check.ONNXPackage: false}, say: "outside the directory"},
		{name: "a truncated shard", link: "copy", code: 1, say: "ends at byte", tamper: func(t *testing.T, out string) {
			shards, _ := filepath.Glob(filepath.Join(out, "checkpoint", "*.safetensors"))
			must(t, os.Truncate(shards[0], 100))
		}},
		{name: "a missing shard", link: "copy", code: 1, say: "no such file", tamper: func(t *testing.T, out string) {
			must(t, os.RemoveAll(filepath.Join(out, "checkpoint")))
		}},
		// Tampering check used to pass (issue 30).
		{name: "an empty model.onnx", link: "copy", code: 1, say: "holds no graph", tamper: func(t *testing.T, out string) {
			must(t, os.Truncate(filepath.Join(out, "model.onnx"), 0))
		}},
		{name: "weight_spec.json edited", link: "copy", code: 1, say: "weight_spec.json changed since the export", tamper: func(t *testing.T, out string) {
			spec := filepath.Join(out, "weight_spec.json")
			data, err := os.ReadFile(spec)
			must(t, err)
			must(t, os.WriteFile(spec, bytes.Replace(data, []byte(`"BF16"`), []byte(`"F16" `), 1), 0o644))
		}},
		{name: "weight_spec.json removed", link: "copy", code: 1, say: "weight_spec.json, the weight spec the model records, cannot be read", tamper: func(t *testing.T, out string) {
			must(t, os.Remove(filepath.Join(out, "weight_spec.json")))
		}},
		{name: "two same-size shards swapped", link: "copy", src: sameSize, code: 1, say: "the file was swapped or replaced", tamper: func(t *testing.T, out string) {
			a, b := filepath.Join(out, "checkpoint", "model-00001-of-00002.safetensors"), filepath.Join(out, "checkpoint", "model-00002-of-00002.safetensors")
			must(t, os.Rename(a, a+".x"))
			must(t, os.Rename(b, a))
			must(t, os.Rename(a+".x", b))
		}},
		{name: "checkpoint/ a symlink out of the directory", link: "copy", verdict: map[string]bool{check.ONNXRuntime: false, check.ONNXPackage: false}, say: "outside the directory", tamper: func(t *testing.T, out string) {
			must(t, os.RemoveAll(filepath.Join(out, "checkpoint")))
			must(t, os.Symlink(tinyLlama, filepath.Join(out, "checkpoint")))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := filepath.Join(t.TempDir(), "out")
			if tc.src == "" {
				tc.src = tinyLlama
			}
			if code, _, errOut := strata(t, "export", tc.src, "--out", out, "--plugin-dir", llamaDir, "--link", tc.link); code != 0 {
				t.Fatal(errOut)
			}
			if tc.tamper != nil {
				tc.tamper(t, out)
			}
			code, text, errOut := strata(t, "check", out)
			if code != tc.code || !strings.Contains(text+errOut, tc.say) {
				t.Errorf("exit %d (want %d), want %q in:\n%s%s", code, tc.code, tc.say, text, errOut)
			}
			code, stdout, _ := strata(t, "check", out, "--json")
			var r check.Report
			if err := json.Unmarshal([]byte(stdout), &r); err != nil || code != tc.code {
				t.Fatalf("--json: exit %d, %v: %q", code, err, stdout)
			}
			for _, v := range r.Loaders {
				if want, ok := tc.verdict[v.Loader]; ok && v.Accepts != want {
					t.Errorf("%s accepts: %v, want %v (%v)", v.Loader, v.Accepts, want, v.Why)
				}
			}
			if tc.code != 0 {
				followAdvice(t, tc.src, out, tc.link, errOut)
			}
		})
	}
	code, _, errOut := strata(t, "check", t.TempDir())
	if code != 1 || !strings.Contains(errOut, "holds no .onnx model") {
		t.Errorf("an empty directory: exit %d, %s", code, errOut)
	}
}

// --link auto clones where the file system can; on one that cannot (ext4,
// tmpfs) it hard-links and says why.
func TestLinkAutoSaysWhatItDid(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	src := tiny(t, filepath.Join(root, "src"))
	out := filepath.Join(root, "out")
	code, stdout, errOut := strata(t, "export", src, "--out", out, "--plugin-dir", llamaDir)
	if code != 0 {
		t.Fatal(errOut)
	}
	d, err := outdir.Open(t.Context(), filepath.Join(root, "probe"), outdir.Options{Tool: "export"})
	must(t, err)
	cloneErr := d.CanClone(filepath.Join(src, "model.safetensors"))
	d.Discard()
	switch {
	case cloneErr == nil:
		if !strings.Contains(stdout, "cloned (reflink)") {
			t.Errorf("a file system with reflink, but:\n%s", stdout)
		}
	case errors.Is(cloneErr, outdir.ErrNoClone):
		if !strings.Contains(stdout, "hard-linked into checkpoint/") || !strings.Contains(errOut, "hard-linked, not cloned") || !strings.Contains(errOut, "--link copy") {
			t.Errorf("no reflink here (%v), but:\n%s%s", cloneErr, stdout, errOut)
		}
	default:
		t.Fatalf("probing reflink: %v", cloneErr)
	}
}

// followAdvice does what check advised for a broken export: the export
// again with --overwrite, after which check passes (issue 30).
func followAdvice(t *testing.T, src, out, link, advice string) {
	t.Helper()
	if !strings.Contains(advice, "--overwrite") {
		t.Fatalf("check's advice does not name --overwrite:\n%s", advice)
	}
	args := []string{"export", src, "--out", out, "--plugin-dir", llamaDir, "--link", link, "--overwrite"}
	if code, _, errOut := strata(t, args...); code != 0 {
		t.Fatalf("the advised re-run failed: %s", errOut)
	}
	if code, text, errOut := strata(t, "check", out); code != 0 {
		t.Errorf("check after the advised re-run: exit %d\n%s%s", code, text, errOut)
	}
}

// sameSizeShards is the two-shard Llama fixture with its smaller shard's
// header padded (with spaces, as safetensors allows) to the larger one's
// size: two shards a swap leaves every size as it was.
func sameSizeShards(t *testing.T) string {
	t.Helper()
	src := filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-bf16-sharded", "model")
	dir := filepath.Join(t.TempDir(), "sharded")
	must(t, os.MkdirAll(dir, 0o755))
	entries, err := os.ReadDir(src)
	must(t, err)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644))
	}
	big, err := os.Stat(filepath.Join(dir, "model-00001-of-00002.safetensors"))
	must(t, err)
	small := filepath.Join(dir, "model-00002-of-00002.safetensors")
	data, err := os.ReadFile(small)
	must(t, err)
	pad := int(big.Size()) - len(data)
	n := binary.LittleEndian.Uint64(data[:8])
	padded := binary.LittleEndian.AppendUint64(nil, n+uint64(pad))
	padded = append(padded, data[8:8+n]...)
	padded = append(padded, bytes.Repeat([]byte(" "), pad)...)
	padded = append(padded, data[8+n:]...)
	must(t, os.WriteFile(small, padded, 0o644))
	return dir
}

// A 3 GB model.onnx (sparse: one node of 3 GB) is streamed: check's memory
// stays bounded (issue 30: it took 3 GB of RSS).
func TestCheckStreamsTheModel(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const size = 3 << 30
	var head []byte
	head = protowire.AppendTag(head, 7, protowire.BytesType)  // graph
	inner := protowire.AppendTag(nil, 1, protowire.BytesType) // one node
	nodeLen := uint64(size - len(head) - 10 - len(inner) - 10)
	inner = protowire.AppendVarint(inner, nodeLen)
	head = protowire.AppendVarint(head, uint64(len(inner))+nodeLen)
	head = append(head, inner...)
	path := filepath.Join(dir, "model.onnx")
	must(t, os.WriteFile(path, head, 0o644))
	must(t, os.Truncate(path, int64(len(head))+int64(nodeLen)))
	// The peak from strata's own --stats (procfs): a child's ru_maxrss
	// includes the test binary's RSS when it was spawned.
	statsPath := filepath.Join(t.TempDir(), "stats.json")
	cmd := exec.Command(strataBin, "--stats", statsPath, "check", dir)
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), "without nodes or outputs") {
		t.Fatalf("exit %d, want 1 saying the graph has no outputs:\n%s", code, out)
	}
	data, err := os.ReadFile(statsPath)
	must(t, err)
	var stats struct {
		Host struct {
			PeakRSS int64 `json:"peak_rss_bytes"`
		} `json:"host"`
	}
	must(t, json.Unmarshal(data, &stats))
	if rss := stats.Host.PeakRSS; rss <= 0 || rss > 200<<20 {
		t.Errorf("check of a 3 GB model peaked at %d MiB of RSS", rss>>20)
	}
}
