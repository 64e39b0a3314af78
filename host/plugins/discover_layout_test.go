package plugins

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
)

// The in-tree plugins' layout, which makes `go install ./cmd/...` name each
// binary as discovery expects: plugins/NAME is a library (package NAME,
// exporting Plugin()), and cmd/strata-plugin-NAME/main.go serves it. A
// plugin added as package main would build under go install as NAME, which
// discovery never finds.
func TestEveryPluginIsALibraryWithAMainInCmd(t *testing.T) {
	root := testbin.Root()
	libs := dirNames(t, filepath.Join(root, "plugins"), "")
	mains := dirNames(t, filepath.Join(root, "cmd"), BinaryPrefix)
	if !slices.Equal(libs, mains) {
		t.Errorf("plugins/ holds %v, cmd/strata-plugin-* %v: each plugins/NAME needs cmd/strata-plugin-NAME/main.go and the reverse (docs/plugins.md, In this repository)", libs, mains)
	}
	for _, name := range libs {
		for pkg, files := range packages(t, filepath.Join(root, "plugins", name)) {
			if pkg != name && pkg != name+"_test" {
				t.Errorf("plugins/%s: package %s in %v: make it package %s and move func main to cmd/%s%s/main.go", name, pkg, files, name, BinaryPrefix, name)
			}
		}
		main, err := os.ReadFile(filepath.Join(root, "cmd", BinaryPrefix+name, "main.go"))
		if err != nil {
			t.Errorf("plugin %s has no main: %v", name, err)
		} else if !strings.Contains(string(main), "sdk.Serve("+name+".Plugin())") {
			t.Errorf("cmd/%s%s/main.go does not serve %s.Plugin():\n%s", BinaryPrefix, name, name, main)
		}
	}
}

// dirNames lists the directories in dir whose names start with prefix,
// without it.
func dirNames(t *testing.T, dir, prefix string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
			out = append(out, strings.TrimPrefix(e.Name(), prefix))
		}
	}
	return out
}

// packages maps each package clause in dir's Go files to those files.
func packages(t *testing.T, dir string) map[string][]string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	out := map[string][]string{}
	for _, f := range files {
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		out[file.Name.Name] = append(out[file.Name.Name], filepath.Base(f))
	}
	return out
}
