package plugins

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func writeExec(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
		t.Fatal(err)
	}
}

func TestFindOrderAndFilters(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	writeExec(t, filepath.Join(a, "strata-plugin-llama"), 0o755)
	writeExec(t, filepath.Join(a, "strata-plugin-notexec"), 0o644)
	writeExec(t, filepath.Join(a, "other-tool"), 0o755)
	writeExec(t, filepath.Join(a, "strata-plugin-"), 0o755)
	writeExec(t, filepath.Join(b, "strata-plugin-glm"), 0o755)
	writeExec(t, filepath.Join(b, "strata-plugin-llama"), 0o755)
	if err := os.Mkdir(filepath.Join(b, "strata-plugin-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	got := Find([]SearchDir{{b, "--plugin-dir"}, {a, "next to strata"}, {b, "again"}})
	var paths []string
	for _, c := range got {
		paths = append(paths, c.Path)
	}
	want := []string{filepath.Join(b, "strata-plugin-glm"), filepath.Join(b, "strata-plugin-llama"), filepath.Join(a, "strata-plugin-llama")}
	if !slices.Equal(paths, want) {
		t.Errorf("found %v\nwant %v", paths, want)
	}
	if got[0].Name != "glm" || got[0].Source != "--plugin-dir" {
		t.Errorf("candidate %+v", got[0])
	}
}

func TestSearchPathPrecedence(t *testing.T) {
	t.Setenv(EnvPath, "/env/one"+string(os.PathListSeparator)+"/env/two")
	t.Setenv("XDG_CONFIG_HOME", "/xdg")
	dirs := SearchPath([]string{"/flag"})
	var got []string
	for _, d := range dirs {
		got = append(got, d.Source+"="+d.Dir)
	}
	exe, _ := os.Executable()
	exe, _ = filepath.EvalSymlinks(exe)
	want := []string{"--plugin-dir=/flag", EnvPath + "=/env/one", EnvPath + "=/env/two",
		"next to strata=" + filepath.Dir(exe), "config dir=/xdg/strata/plugins"}
	if !slices.Equal(got, want) {
		t.Errorf("search path %v\nwant %v", got, want)
	}
}
