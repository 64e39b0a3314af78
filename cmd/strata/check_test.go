package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/check"
	"github.com/strata-llm/strata/host/outdir"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		link    string
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := filepath.Join(t.TempDir(), "out")
			if code, _, errOut := strata(t, "export", tinyLlama, "--out", out, "--plugin-dir", llamaDir, "--link", tc.link); code != 0 {
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
				followAdvice(t, out, tc.link, errOut)
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
func followAdvice(t *testing.T, out, link, advice string) {
	t.Helper()
	if !strings.Contains(advice, "--overwrite") {
		t.Fatalf("check's advice does not name --overwrite:\n%s", advice)
	}
	args := []string{"export", tinyLlama, "--out", out, "--plugin-dir", llamaDir, "--link", link, "--overwrite"}
	if code, _, errOut := strata(t, args...); code != 0 {
		t.Fatalf("the advised re-run failed: %s", errOut)
	}
	if code, text, errOut := strata(t, "check", out); code != 0 {
		t.Errorf("check after the advised re-run: exit %d\n%s%s", code, text, errOut)
	}
}
