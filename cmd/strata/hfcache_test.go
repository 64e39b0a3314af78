package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hfCache lays out a Hugging Face hub cache holding tiny-llama as
// org/tiny-llama: blobs named by their hash, two snapshots whose files are
// symlinks into ../../blobs, refs/main at the second and refs/v1 at the
// first. It returns the cache directory and the two commits.
func hfCacheRepo(t *testing.T) (cache, first, second string) {
	t.Helper()
	cache = filepath.Join(t.TempDir(), "hub")
	repo := filepath.Join(cache, "models--org--tiny-llama")
	first, second = strings.Repeat("a", 40), "b1c2d3e4f5"+strings.Repeat("0", 30)
	for _, commit := range []string{first, second} {
		snap := filepath.Join(repo, "snapshots", commit)
		if err := os.MkdirAll(snap, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"config.json", "model.safetensors"} {
			data := read(t, filepath.Join(tinyLlama, name))
			sum := sha256.Sum256(data)
			blob := filepath.Join(repo, "blobs", hex.EncodeToString(sum[:]))
			if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(blob, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join("..", "..", "blobs", hex.EncodeToString(sum[:])), filepath.Join(snap, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for ref, commit := range map[string]string{"main": second, "v1": first} {
		if err := os.MkdirAll(filepath.Join(repo, "refs"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, "refs", ref), []byte(commit), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cache, first, second
}

func TestHuggingFaceCacheModels(t *testing.T) {
	cache, first, second := hfCacheRepo(t)
	repo := filepath.Join(cache, "models--org--tiny-llama")
	cases := map[string]struct {
		env      map[string]string
		args     []string
		code     int
		snapshot string   // the commit inspect must have opened
		want     []string // in stderr
	}{
		"hub id, HF_HUB_CACHE":  {env: map[string]string{"HF_HUB_CACHE": cache}, args: []string{"org/tiny-llama"}, snapshot: second},
		"hub id, HF_HOME/hub":   {env: map[string]string{"HF_HOME": filepath.Dir(cache)}, args: []string{"org/tiny-llama"}, snapshot: second},
		"hub id, ~/.cache":      {env: map[string]string{"HOME": filepath.Dir(filepath.Dir(filepath.Dir(cache)))}, args: []string{"org/tiny-llama"}, code: 1, want: []string{".cache/huggingface/hub/models--org--tiny-llama", "hf download org/tiny-llama"}},
		"hub id, ref revision":  {env: map[string]string{"HF_HUB_CACHE": cache}, args: []string{"org/tiny-llama", "--revision", "v1"}, snapshot: first},
		"hub id, commit":        {env: map[string]string{"HF_HUB_CACHE": cache}, args: []string{"org/tiny-llama", "--revision", first}, snapshot: first},
		"hub id, commit prefix": {env: map[string]string{"HF_HUB_CACHE": cache}, args: []string{"org/tiny-llama", "--revision", second[:8]}, snapshot: second},
		"repo dir":              {args: []string{repo}, snapshot: second},
		"repo dir, revision":    {args: []string{repo, "--revision", "v1"}, snapshot: first},
		"snapshot dir":          {args: []string{filepath.Join(repo, "snapshots", first)}, snapshot: first},
		"hub id not cached": {env: map[string]string{"HF_HUB_CACHE": cache}, args: []string{"meta-llama/Llama-3.1-8B"}, code: 1,
			want: []string{filepath.Join(cache, "models--meta-llama--Llama-3.1-8B"), "HF_HUB_CACHE", "never downloads", "hf download meta-llama/Llama-3.1-8B"}},
		"unknown revision": {env: map[string]string{"HF_HUB_CACHE": cache}, args: []string{"org/tiny-llama", "--revision", "v2"}, code: 1,
			want: []string{"no ref or snapshot v2", "refs: main, v1", "hf download org/tiny-llama --revision v2"}},
		"revision of a plain dir": {args: []string{tinyLlama, "--revision", "main"}, code: 1, want: []string{"is a checkpoint directory"}},
		"4-digit commit prefix":   {env: map[string]string{"HF_HUB_CACHE": cache}, args: []string{"org/tiny-llama", "--revision", second[:4]}, snapshot: second},
		"malformed revision":      {env: map[string]string{"HF_HUB_CACHE": cache}, args: []string{"org/tiny-llama", "--revision", "v1~1"}, code: 2, want: []string{`--revision "v1~1": not a ref name`}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			for _, k := range []string{"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"} {
				t.Setenv(k, "")
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, out, errOut := strata(t, append([]string{"inspect", "--json", "--plugin-dir", llamaDir}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", code, tc.code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
			if tc.snapshot == "" {
				return
			}
			var r inspectReport
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			if r.HubID != "org/tiny-llama" || r.Commit != tc.snapshot || !r.Supported {
				t.Errorf("opened %+v, want org/tiny-llama at %s", r, tc.snapshot)
			}
		})
	}
}

// An export from the cache names the checkpoint by hub id and commit, and
// compile and convert resolve a hub id too.
func TestExportFromHuggingFaceCache(t *testing.T) {
	cache, _, second := hfCacheRepo(t)
	t.Setenv("HF_HUB_CACHE", cache)
	out := filepath.Join(t.TempDir(), "o")
	code, _, errOut := strata(t, "export", "org/tiny-llama", "--out", out, "--link", "copy", "--plugin-dir", llamaDir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var spec struct{ Checkpoint string }
	if err := json.Unmarshal(read(t, filepath.Join(out, "weight_spec.json")), &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Checkpoint != "org/tiny-llama@"+second {
		t.Errorf("spec names the checkpoint %q", spec.Checkpoint)
	}
	comp := filepath.Join(t.TempDir(), "c")
	code, _, errOut = strata(t, "compile", "org/tiny-llama", "--out", comp, "--link", "copy", "--dry-run", "--plugin-dir", llamaDir)
	if code != 0 || !fileExists(filepath.Join(comp, "export", "model.onnx")) {
		t.Fatalf("compile of a hub id: exit %d: %s", code, errOut)
	}
	conv := filepath.Join(t.TempDir(), "v")
	code, _, errOut = strata(t, "convert", "org/tiny-llama", "--out", conv, "--plugin-dir", llamaDir)
	if code != 0 || !fileExists(filepath.Join(conv, "model.safetensors.index.json")) {
		t.Fatalf("convert of a hub id: exit %d: %s", code, errOut)
	}
}
