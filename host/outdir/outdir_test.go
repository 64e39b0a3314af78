package outdir

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func open(t *testing.T, dir string, sources ...string) *Dir {
	t.Helper()
	d, err := Open(context.Background(), dir, Options{Tool: "export", Sources: sources})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOwnedFilesAreReplacedForeignOnesRefused(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	d := open(t, out)
	if err := d.WriteFile("model.onnx", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteFile("weights/a.safetensors", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = open(t, out)
	if err := d.WriteFile("model.onnx", []byte("two")); err != nil {
		t.Fatalf("replacing strata's own file: %v", err)
	}
	d.Close()
	if got, _ := os.ReadFile(filepath.Join(out, "model.onnx")); string(got) != "two" {
		t.Fatalf("model.onnx = %q", got)
	}
	// Someone rewrites strata's file: it is no longer strata's.
	write(t, filepath.Join(out, "weights", "a.safetensors"), "user's")
	_, err := Open(context.Background(), out, Options{Tool: "export"})
	if err == nil || !strings.Contains(err.Error(), "weights/a.safetensors") {
		t.Fatalf("a changed file was not refused: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(out, "weights", "a.safetensors")); string(got) != "user's" {
		t.Fatal("the user's file was touched")
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, root, out string) []string // returns sources
		want  string
	}{
		{"foreign file", func(t *testing.T, root, out string) []string {
			write(t, filepath.Join(out, "model.onnx"), "not strata's")
			return nil
		}, "model.onnx, which strata export did not write"},
		{"symlinked subdirectory", func(t *testing.T, root, out string) []string {
			write(t, filepath.Join(root, "src", "x"), "x")
			os.MkdirAll(out, 0o755)
			os.Symlink(filepath.Join(root, "src"), filepath.Join(out, "checkpoint"))
			return nil
		}, "checkpoint"},
		{"output is the source", func(t *testing.T, root, out string) []string {
			write(t, filepath.Join(out, "config.json"), "{}")
			return []string{out}
		}, "it is the source"},
		{"output contains the source", func(t *testing.T, root, out string) []string {
			write(t, filepath.Join(out, "checkpoint", "config.json"), "{}")
			return []string{filepath.Join(out, "checkpoint")}
		}, "it contains the source"},
		{"output contains the source through a symlink", func(t *testing.T, root, out string) []string {
			write(t, filepath.Join(out, "weights", "config.json"), "{}")
			os.Symlink(filepath.Join(out, "weights"), filepath.Join(root, "link"))
			return []string{filepath.Join(root, "link")}
		}, "it contains the source"},
		{"not a directory", func(t *testing.T, root, out string) []string {
			write(t, out, "file")
			return nil
		}, "not a directory"},
		{"another tool's output", func(t *testing.T, root, out string) []string {
			d, err := Open(context.Background(), out, Options{Tool: "convert-bin"})
			if err != nil {
				t.Fatal(err)
			}
			d.Close()
			return nil
		}, "strata convert-bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			out := filepath.Join(root, "out")
			sources := tc.setup(t, root, out)
			before := snapshot(t, root)
			d, err := Open(context.Background(), out, Options{Tool: "export", Sources: sources})
			if err == nil {
				d.Close()
				t.Fatalf("not refused")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			if after := snapshot(t, root); after != before {
				t.Fatalf("a refused Open changed the tree:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// snapshot lists every path under root with its inode, size and content.
func snapshot(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		st := info.Sys().(*syscall.Stat_t)
		data := ""
		if info.Mode().IsRegular() {
			d, _ := os.ReadFile(p)
			data = string(d)
		}
		b.WriteString(p + " " + info.Mode().String() + " " + string(rune(st.Ino%1000+'0')) + " " + data + "\n")
		return nil
	})
	return b.String()
}

func TestInsideTheSourceIsFineWhenNothingCollides(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	write(t, filepath.Join(src, "config.json"), "{}")
	d := open(t, filepath.Join(src, "exported"), src)
	if err := d.WriteFile("model.onnx", []byte("m")); err != nil {
		t.Fatal(err)
	}
	d.Close()
}

func TestNeverFollowsALinkInside(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	out := filepath.Join(root, "out")
	d := open(t, out)
	if err := d.WriteFile("checkpoint/a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	d.Close()
	// Swap strata's directory for a symlink to elsewhere.
	write(t, filepath.Join(root, "victim", "a"), "precious")
	os.RemoveAll(filepath.Join(out, "checkpoint"))
	os.Symlink(filepath.Join(root, "victim"), filepath.Join(out, "checkpoint"))
	if _, err := Open(context.Background(), out, Options{Tool: "export"}); err == nil {
		t.Fatal("a symlink where strata's directory was is not refused")
	}
	if got, _ := os.ReadFile(filepath.Join(root, "victim", "a")); string(got) != "precious" {
		t.Fatal("followed the link")
	}
}

func TestLockRefusesASecondWriter(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	d := open(t, out)
	defer d.Close()
	_, err := Open(context.Background(), out, Options{Tool: "export"})
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "another strata process") {
		t.Fatalf("second writer: %v", err)
	}
}

func TestTempFilesOfAKilledRunAreCleaned(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	d := open(t, out)
	f, err := d.Create("weights/big.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("partial"))
	// A killed run: no Commit, no Close, the lock released by the kernel.
	tmp := filepath.Join(out, "weights", f.tmp)
	d.release()
	// A look-alike strata did not make stays.
	alike := filepath.Join(out, ".strata-tmp-000000000000-1-x")
	write(t, alike, "?")
	d2 := open(t, out)
	defer d2.Close()
	if _, err := os.Lstat(tmp); !os.IsNotExist(err) {
		t.Fatalf("temporary file %s left by a killed run is still there", tmp)
	}
	if _, err := os.Lstat(alike); err != nil {
		t.Fatal("a temp-like file strata did not make was removed")
	}
}

func TestModeIsUmaskedNot0600(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	d := open(t, out)
	defer d.Close()
	if err := d.WriteFile("weights/w", []byte("w")); err != nil {
		t.Fatal(err)
	}
	info, _ := os.Stat(filepath.Join(out, "weights", "w"))
	if info.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, want 0644", info.Mode().Perm())
	}
}

func TestDiscardRemovesOnlyWhatItMade(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	d := open(t, out)
	d.WriteFile("checkpoint/a", []byte("a"))
	d.WriteFile("model.onnx", []byte("m"))
	d.Discard()
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a failed run's new directory is still there")
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// A copy stops within a chunk of its cancellation and leaves nothing.
func TestCopyHonoursCancellation(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	d := open(t, out)
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := d.Copy(ctx, zeros{}, "checkpoint/endless")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("copy of an endless stream: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the copy stopped %s after its cancellation", took)
	}
	entries, _ := os.ReadDir(filepath.Join(out, "checkpoint"))
	if len(entries) != 0 {
		t.Errorf("a cancelled copy left %v", entries)
	}
}

func openShared(t *testing.T, dir string) *Dir {
	t.Helper()
	d, err := Open(context.Background(), dir, Options{Tool: "convert", Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSharedWritersMergeTheirManifests(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	a := openShared(t, out)
	b := openShared(t, out) // at once: both hold the lock shared
	if _, err := Open(context.Background(), out, Options{Tool: "convert"}); !errors.Is(err, ErrBusy) {
		t.Fatalf("an exclusive writer beside shared ones: %v", err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(a.WriteFile("m/a.json", []byte("a")))
	must(b.WriteFile("m/b.json", []byte("b")))
	// b replaces and reads what a wrote: it learns a's entries from disk.
	if got, err := b.ReadFile("m/a.json"); err != nil || string(got) != "a" {
		t.Fatalf("b reading a's file: %q %v", got, err)
	}
	must(b.WriteFile("m/a.json", []byte("a2")))
	must(a.Close())
	must(b.Close())

	c := openShared(t, out)
	defer c.Close()
	for _, f := range []string{"m/a.json", "m/b.json"} {
		if !c.Owned(f) {
			t.Errorf("%s lost from the merged manifest", f)
		}
	}
	m := c.load()
	if len(m.Sessions) != 1 || m.Sessions[0] != c.session {
		t.Errorf("ended sessions kept: %v (this one %s)", m.Sessions, c.session)
	}
}

func TestSharedWriterCleansAKilledWritersTemps(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	killed := openShared(t, out)
	f, err := killed.Create("shard.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	other, err := killed.Create("other.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	f.File.Close()
	other.File.Close()
	killed.release() // as a SIGKILL: the lock goes, the manifest keeps its session

	d := openShared(t, out) // a live writer's temps are never cleaned at Open
	if _, err := os.Stat(filepath.Join(out, f.tmp)); err != nil {
		t.Fatalf("Open of a shared directory removed another session's file: %v", err)
	}
	d.RemoveTempsOf("shard.safetensors")
	if _, err := os.Stat(filepath.Join(out, f.tmp)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed run's temp of the shard stays: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, other.tmp)); err != nil {
		t.Errorf("another file's temp went with it: %v", err)
	}
	d.RemoveStaleTemps()
	if _, err := os.Stat(filepath.Join(out, other.tmp)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("RemoveStaleTemps left %s: %v", other.tmp, err)
	}
	d.Close()
	if s := openShared(t, out); len(s.load().Sessions) != 1 {
		t.Errorf("cleaned sessions stay recorded: %v", s.load().Sessions)
	} else {
		s.Close()
	}
}

func TestAdoptedTreeReplacesTheEarlierOneWhole(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	outside := filepath.Join(t.TempDir(), "outside")
	write(t, filepath.Join(outside, "keep"), "user's")
	for round, content := range []string{"one", "two"} {
		d := open(t, out)
		tmp, abs, err := d.TempDir(".", "qpc")
		if err != nil {
			t.Fatal(err)
		}
		// Another program fills it, a link to outside included.
		write(t, filepath.Join(abs, "qpc", "programqpc.bin"), content)
		if err := os.Symlink(outside, filepath.Join(abs, "qpc", "link")); err != nil {
			t.Fatal(err)
		}
		if err := d.AdoptTree(tmp+"/qpc", "qpc"); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if err := d.RemoveTemp(tmp); err != nil {
			t.Fatal(err)
		}
		d.Close()
		if got, _ := os.ReadFile(filepath.Join(out, "qpc", "programqpc.bin")); string(got) != content {
			t.Fatalf("round %d: qpc holds %q", round, got)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(outside, "keep")); string(got) != "user's" {
		t.Fatal("removing the old tree followed its link out of the directory")
	}
	entries, _ := os.ReadDir(out)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			t.Errorf("left %s", e.Name())
		}
	}
	// A killed run's filled temporary directory goes at the next Open.
	d := open(t, out)
	_, abs, _ := d.TempDir(".", "qpc")
	write(t, filepath.Join(abs, "qpc", "x"), "partial")
	d.release()
	open(t, out).Close()
	if _, err := os.Stat(abs); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a killed run's temporary directory stays: %v", err)
	}
	// The tree is strata's: Remove takes it whole.
	d = open(t, out)
	if err := d.Remove("qpc"); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if _, err := os.Stat(filepath.Join(out, "qpc")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("qpc stays: %v", err)
	}
}

// Shared writers racing to make one file: exactly one writes it, the others
// get fs.ErrExist and read the winner's.
func TestWriteFileNewOneWriterWins(t *testing.T) {
	t.Parallel()
	for round := range 20 {
		out := filepath.Join(t.TempDir(), "out")
		writers := []*Dir{openShared(t, out), openShared(t, out), openShared(t, out)}
		errs := make(chan error, len(writers))
		for i, d := range writers {
			go func() { errs <- d.WriteFileNew("m/run.json", []byte{byte('a' + i)}) }()
		}
		won := 0
		for range writers {
			switch err := <-errs; {
			case err == nil:
				won++
			case !errors.Is(err, fs.ErrExist):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d writers wrote it, want 1", round, won)
		}
		want, err := writers[0].ReadFile("m/run.json")
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range writers {
			if got, err := d.ReadFile("m/run.json"); err != nil || string(got) != string(want) {
				t.Errorf("round %d: a writer reads %q, %v; want %q", round, got, err, want)
			}
			d.Close()
		}
		if left, _ := filepath.Glob(filepath.Join(out, "m", tempPrefix+"*")); len(left) > 0 {
			t.Errorf("temporary files left: %v", left)
		}
	}
}

// A scratch file leaves no name in the directory, even before it is closed.
func TestScratchLeavesNoName(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(context.Background(), dir, Options{Tool: "test"})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(dir)
	f, err := d.Scratch()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("spilled")); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadDir(dir)
	f.Close()
	if len(after) != len(before) {
		t.Errorf("the directory held %d entries before the scratch file and %d with it", len(before), len(after))
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// WriteFileOnce makes a file once among writers sharing a directory: the
// first makes it; one that finds it recorded by another writer but not yet
// in place (that writer between recording and renaming, or killed there)
// makes it itself; later ones find it; a file no writer recorded is
// refused, not taken.
func TestWriteFileOnce(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	a := openShared(t, out)
	// a records m/run.json as a writer does just before renaming it there.
	if err := a.record("m/run.json", Entry{Kind: kindFile, Ino: 1}, true); err != nil {
		t.Fatal(err)
	}
	b := openShared(t, out)
	if !b.Owned("m/run.json") || b.Exists("m/run.json") {
		t.Fatalf("b should see m/run.json recorded and absent: owned %v, exists %v", b.Owned("m/run.json"), b.Exists("m/run.json"))
	}
	if made, err := b.WriteFileOnce("m/run.json", []byte("b")); err != nil || !made {
		t.Fatalf("recorded but absent: made %v, %v", made, err)
	}
	if made, err := a.WriteFileOnce("m/run.json", []byte("a")); err != nil || made {
		t.Fatalf("already there: made %v, %v", made, err)
	}
	if got, err := a.ReadFile("m/run.json"); err != nil || string(got) != "b" {
		t.Errorf("a reads %q, %v; want b's", got, err)
	}
	if err := os.WriteFile(filepath.Join(out, "m", "foreign.json"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if made, err := a.WriteFileOnce("m/foreign.json", []byte("a")); err == nil || made {
		t.Errorf("a file no writer recorded: made %v, %v; want a refusal", made, err)
	}
}

// Free space is the file system's available bytes, for an open directory
// and for one not made yet (its nearest existing ancestor's); a path under
// a regular file is an error, not a guess.
func TestAvailable(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	want := int64(st.Bavail) * int64(st.Bsize)
	near := func(got int64) bool { return got > want-1<<30 && got < want+1<<30 } // other tests write and delete meanwhile
	d := open(t, filepath.Join(root, "out"))
	defer d.Close()
	if got, err := d.Available(); err != nil || !near(got) {
		t.Errorf("Available() = %d, %v; want about %d", got, err, want)
	}
	if got, err := AvailableAt(filepath.Join(root, "not", "yet", "made")); err != nil || !near(got) {
		t.Errorf("AvailableAt(a path to make) = %d, %v; want about %d", got, err, want)
	}
	write(t, filepath.Join(root, "file"), "x")
	if _, err := AvailableAt(filepath.Join(root, "file", "out")); err == nil {
		t.Error("AvailableAt(a path under a regular file) gave no error")
	}
}
