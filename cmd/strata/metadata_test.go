package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// No output holds a path of this machine, and model.onnx's metadata points
// at weight_spec.json (with its hash) instead of embedding it.
func TestNoMachinePathsInOutputs(t *testing.T) {
	t.Parallel()
	compiler := fakeCompiler(t)
	// The checkpoint lies under a distinctive directory, to be searched for.
	src := filepath.Join(t.TempDir(), "where-the-checkpoint-lies")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"config.json", "model.safetensors"} {
		if err := os.WriteFile(filepath.Join(src, name), read(t, filepath.Join(tinyLlama, name)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := map[string][]string{
		"whole":                 {"export"},
		"layerwise, kept":       {"export", "--layerwise", "--keep-windows"},
		"materialize, qaic":     {"export", "--weights", "materialize", "--weight-spec", "qaic"},
		"compile":               {"compile", "--compiler", compiler},
		"compile per window":    {"compile", "--compiler", compiler, "--compile-per-window"},
		"subfunctions, float16": {"export", "--subfunctions", "--dtype", "float16"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out-dir-of-this-machine")
			code, _, errOut := strata(t, append([]string{args[0], src, "--out", out, "--plugin-dir", llamaDir}, args[1:]...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			filepath.WalkDir(out, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || filepath.Base(filepath.Dir(path)) == "checkpoint" || filepath.Base(path) == "args.txt" {
					return err // shards are the checkpoint's own bytes; args.txt is the fake compiler's
				}
				data := read(t, path)
				for _, p := range []string{src, out, compiler} {
					if bytes.Contains(data, []byte(p)) {
						t.Errorf("%s holds the path %s", path, p)
					}
				}
				return nil
			})
			modelDir := out
			if args[0] == "compile" {
				modelDir = filepath.Join(out, "export")
			}
			checkSpecReference(t, modelDir)
		})
	}
}

func checkSpecReference(t *testing.T, dir string) {
	t.Helper()
	m := &onnxpb.ModelProto{}
	if err := proto.Unmarshal(read(t, filepath.Join(dir, "model.onnx")), m); err != nil {
		t.Fatal(err)
	}
	spec := read(t, filepath.Join(dir, "weight_spec.json"))
	var parsed struct {
		Checkpoint string
		Weights    []any
		Files      []any
	}
	if err := json.Unmarshal(spec, &parsed); err != nil {
		t.Fatal(err)
	}
	if parsed.Checkpoint != "where-the-checkpoint-lies" {
		t.Errorf("the spec names the checkpoint %q", parsed.Checkpoint)
	}
	sum := sha256.Sum256(spec)
	want, _ := json.Marshal(map[string]any{"format": "strata.weight_spec", "version": 1, "path": "weight_spec.json",
		"sha256": hex.EncodeToString(sum[:]), "weights": len(parsed.Weights), "files": len(parsed.Files)})
	for _, p := range m.GetMetadataProps() {
		if p.GetKey() != "strata.weight_spec" {
			continue
		}
		var got, wantV any
		json.Unmarshal([]byte(p.GetValue()), &got)
		json.Unmarshal(want, &wantV)
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(wantV)
		if string(g) != string(w) {
			t.Errorf("metadata strata.weight_spec\n got %s\nwant %s", g, w)
		}
		return
	}
	t.Error("model.onnx has no strata.weight_spec metadata")
}
