// Package testbin builds strata's binaries for tests that need real
// processes: the host, its plugins, and misbehaving fakes.
package testbin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/headeronly"
)

// Root is the repository root, found from this file's location.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Build compiles the package at pkg (relative to the repository root, e.g.
// "./cmd/strata-plugin-llama") into dir/name.
func Build(dir, name, pkg string) (string, error) {
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = Root()
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, msg)
	}
	return out, nil
}

// FakePlugins installs the fake plugin as dir/<mode>/strata-plugin-fake-<mode>
// for each mode (hard links to one build), so a test can point --plugin-dir
// at exactly one misbehaving plugin. It returns mode -> directory.
func FakePlugins(dir string, modes ...string) (map[string]string, error) {
	bin, err := Build(dir, "fakeplugin", "./internal/fakeplugin")
	if err != nil {
		return nil, err
	}
	defer os.Remove(bin)
	dirs := map[string]string{}
	for _, m := range modes {
		d := filepath.Join(dir, m)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.Link(bin, filepath.Join(d, "strata-plugin-fake-"+m)); err != nil {
			return nil, err
		}
		dirs[m] = d
	}
	return dirs, nil
}

// Processes lists the pids of running processes whose command line mentions
// path: used to prove no plugin outlives its host.
func Processes(path string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && containsPath(cmdline, path) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func containsPath(cmdline []byte, path string) bool {
	return path != "" && bytes.Contains(cmdline, []byte(path))
}

// HeaderOnly writes, into a fresh temporary directory, a header-only
// checkpoint of the shipped release bench/configs/<release>, sharded as
// released.
func HeaderOnly(t testing.TB, release string) string {
	t.Helper()
	r, err := headeronly.LoadRelease(filepath.Join(Root(), "bench", "configs", release))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := headeronly.WriteRelease(dir, r); err != nil {
		t.Fatal(err)
	}
	return dir
}

// HeaderOnlyShards is HeaderOnly with shards of at most maxShardBytes of
// data instead of the release's split.
func HeaderOnlyShards(t testing.TB, release string, maxShardBytes int64) string {
	t.Helper()
	r, err := headeronly.LoadRelease(filepath.Join(Root(), "bench", "configs", release))
	if err != nil {
		t.Fatal(err)
	}
	return HeaderOnlyConfig(t, r.Config, maxShardBytes)
}

// HeaderOnlyConfig writes a header-only BF16 checkpoint of configJSON (a
// real config with its shape shrunk, say) in shards of at most
// maxShardBytes of data, into a directory of the test's own.
func HeaderOnlyConfig(t testing.TB, configJSON []byte, maxShardBytes int64) string {
	t.Helper()
	tensors, err := headeronly.Tensors(configJSON, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := headeronly.Write(dir, configJSON, tensors, maxShardBytes); err != nil {
		t.Fatal(err)
	}
	return dir
}

// HashTree is the sha256 of every file under dir by its slash path, leaving
// out strata's control files (the ownership manifest records inodes, which
// differ between two runs that write the same bytes; locks are empty).
func HashTree(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".strata-") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h := sha256.Sum256(b)
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = hex.EncodeToString(h[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
