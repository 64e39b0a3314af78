package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// export --dry-run and convert --dry-run write nothing (the output is not
// created, the source and its parent unchanged by byte and inode) and
// report the files and sizes a real run then writes.
func TestDryRunWritesNothingAndForetellsTheRun(t *testing.T) {
	t.Parallel()
	type file struct {
		Path  string
		Bytes *int64
	}
	type report struct {
		DryRun  bool `json:"dry_run"`
		Files   []file
		Inputs  []plannedIO
		Windows []string
	}
	for _, tc := range []struct {
		name    string
		args    []string
		inputs  bool     // the report lists model.onnx's inputs
		windows []string // and these windows
	}{
		{name: "export", args: []string{"export", "--link", "hardlink"}, inputs: true},
		{name: "export materialize qaic", args: []string{"export", "--link", "copy", "--weights", "materialize", "--weight-spec", "qaic"}, inputs: true},
		{name: "export target ort", args: []string{"export", "--link", "hardlink", "--target", "ort"}, inputs: true},
		{name: "export layerwise", args: []string{"export", "--link", "hardlink", "--layerwise", "--keep-windows"}, inputs: true, windows: []string{"0-0", "1-1"}},
		{name: "convert", args: []string{"convert", "--dtype", "bfloat16"}},
		{name: "convert fp8", args: []string{"convert", "--quantize", "fp8-block"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			src := tiny(t, filepath.Join(root, "src"))
			out := filepath.Join(root, "out")
			before := tree(t, root, "")
			args := append(slices.Clone(tc.args), src, "--out", out, "--plugin-dir", llamaDir)
			code, text, stderr := strata(t, append(args, "--dry-run")...)
			if code != 0 || !strings.Contains(text, dryRunNote) {
				t.Fatalf("--dry-run: exit %d\n%s%s", code, text, stderr)
			}
			code, stdout, stderr := strata(t, append(args, "--dry-run", "--json")...)
			if code != 0 {
				t.Fatalf("--dry-run --json: exit %d: %s", code, stderr)
			}
			sameTree(t, before, tree(t, root, ""))
			if fileExists(out) {
				t.Fatalf("--dry-run created %s", out)
			}
			var plan report
			if err := json.Unmarshal([]byte(stdout), &plan); err != nil || !plan.DryRun || len(plan.Files) == 0 {
				t.Fatalf("%v: %s", err, stdout)
			}
			if tc.inputs && !slices.ContainsFunc(plan.Inputs, func(io plannedIO) bool { return io.Name == "input_ids" && len(io.Shape) == 2 }) {
				t.Errorf("inputs %+v lack input_ids [batch, seq]", plan.Inputs)
			}
			if !slices.Equal(plan.Windows, tc.windows) {
				t.Errorf("windows %v, want %v", plan.Windows, tc.windows)
			}
			// The real run writes what the plan said, with its sizes.
			code, stdout, stderr = strata(t, append(args, "--json")...)
			if code != 0 {
				t.Fatalf("the real run: exit %d: %s", code, stderr)
			}
			var real struct{ Files []file }
			if err := json.Unmarshal([]byte(stdout), &real); err != nil {
				t.Fatal(err)
			}
			planned := map[string]*int64{}
			for _, f := range plan.Files {
				planned[absPath(t, f.Path)] = f.Bytes
			}
			for _, f := range real.Files {
				want, ok := planned[absPath(t, f.Path)]
				switch {
				case strings.Contains(f.Path, "/weights/"): // the plan gives the directory's data bytes
					if planned[absPath(t, filepath.Join(out, "weights"))] == nil {
						t.Errorf("the run materialised %s; the plan lists no weights/", f.Path)
					}
				case !ok:
					t.Errorf("the run wrote %s, which the plan did not list", f.Path)
				case want != nil && *want != *f.Bytes:
					t.Errorf("%s: %d bytes, the plan said %d", f.Path, *f.Bytes, *want)
				}
			}
			for p := range planned {
				if !fileExists(p) && !strings.HasSuffix(p, "/weights") {
					t.Errorf("the plan listed %s, which the run did not write", p)
				}
			}
		})
	}
}

func absPath(t *testing.T, p string) string {
	t.Helper()
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}
