package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/internal/testbin"
)

// splitMTP writes the glm-f32-mtp fixture with its MTP layer (layer 2) in a
// standalone mtp.safetensors beside model.safetensors, as some GLM-4.7
// repacks ship it: no index names it.
func splitMTP(t *testing.T) string {
	t.Helper()
	src := filepath.Join(testbin.Root(), "conformance", "fixtures", "glm-f32-mtp", "model")
	ck, err := checkpoint.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"config.json", "generation_config.json"} {
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string][]string{}
	for _, k := range ck.Keys() {
		file := "model.safetensors"
		if strings.HasPrefix(k, "model.layers.2.") {
			file = "mtp.safetensors"
		}
		files[file] = append(files[file], k)
	}
	for file, keys := range files {
		var entries []checkpoint.Entry
		for _, k := range keys {
			tn, _ := ck.Tensor(k)
			entries = append(entries, checkpoint.Entry{Name: k, DType: tn.DType, Shape: tn.Shape})
		}
		w, err := checkpoint.CreateSafetensors(filepath.Join(dir, file), entries)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			data, err := ck.ReadTensor(k)
			if err == nil {
				err = w.Write(data)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A standalone mtp.safetensors the checkpoint's index (or single file)
// does not name is read too: the plugin finds the MTP layer in it, and the
// draft binds its weights from it.
func TestStandaloneMTPFileIsSeen(t *testing.T) {
	t.Parallel()
	glmDir := t.TempDir()
	if _, err := testbin.Build(glmDir, "strata-plugin-glm", "./cmd/strata-plugin-glm"); err != nil {
		t.Fatal(err)
	}
	dir := splitMTP(t)
	code, out, errOut := strata(t, "inspect", dir, "--plugin-dir", glmDir)
	if code != 0 || !strings.Contains(out, "separate-file, layers [2]") {
		t.Errorf("inspect: exit %d\n%s%s", code, out, errOut)
	}
	export := filepath.Join(t.TempDir(), "out")
	code, out, errOut = strata(t, "export", dir, "--out", export, "--plugin-dir", glmDir, "--mtp", "draft", "--extra-model", "mtp")
	if code != 0 {
		t.Fatalf("export --mtp draft: exit %d\n%s", code, errOut)
	}
	data, err := os.ReadFile(filepath.Join(export, "weight_spec.json"))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := weights.ParseSpec(data)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(spec.Files, func(f weights.File) bool { return f.Source == "mtp.safetensors" }) || !strings.Contains(out, "mtp.onnx") {
		t.Errorf("the draft does not read mtp.safetensors:\n%s", out)
	}
}

// convert carries the standalone file's MTP layer whole, finding the file
// itself.
func TestConvertStandaloneMTPFile(t *testing.T) {
	t.Parallel()
	dir := splitMTP(t)
	code, out, errOut := strata(t, "convert", dir, "--out", filepath.Join(t.TempDir(), "out"))
	if code != 0 || !strings.Contains(out, "MTP (separate-file)") {
		t.Errorf("convert: exit %d\n%s%s", code, out, errOut)
	}
}
