package outdir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A batch of links lands whole or not at all; a second run keeps the links
// in place, and the directory reopens with every link strata's.
func TestLinksLandTogether(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	a, b := filepath.Join(root, "a.safetensors"), filepath.Join(root, "b.safetensors")
	write(t, a, "a")
	write(t, b, "b")
	out := filepath.Join(root, "out")
	d := open(t, out, root)
	links := []Link{{Src: a, Rel: "checkpoint/a.safetensors"}, {Src: b, Rel: "checkpoint/sub/b.safetensors", Symbolic: true}}

	bad := append(links[:2:2], Link{Src: filepath.Join(root, "missing"), Rel: "checkpoint/c.safetensors"})
	err := d.Links(bad)
	var lerr *os.LinkError
	if !errors.As(err, &lerr) || lerr.Old != bad[2].Src {
		t.Fatalf("a link to a missing file: %v, want an *os.LinkError naming it", err)
	}
	for _, l := range links {
		if _, err := os.Lstat(filepath.Join(out, l.Rel)); err == nil {
			t.Errorf("%s is in place though its batch failed", l.Rel)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(out, "checkpoint", "*")); len(left) > 1 { // sub/ may stay
		t.Errorf("temporary links left: %v", left)
	}

	for range 2 {
		if err := d.Links(links); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(out, links[0].Rel)); err != nil || string(got) != "a" {
		t.Errorf("hard link reads %q (%v)", got, err)
	}
	if target, err := os.Readlink(filepath.Join(out, links[1].Rel)); err != nil || target != b {
		t.Errorf("symlink points at %q (%v), want %s", target, err, b)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = open(t, out, root)
	if err := d.Links(links); err != nil {
		t.Fatalf("re-linking into the reopened directory: %v", err)
	}
	d.Close()
}
