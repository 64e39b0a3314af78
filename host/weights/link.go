package weights

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/strata-llm/strata/internal/atomic"
)

// DataDir is the directory, inside the output directory, through which the
// model reaches the checkpoint's shards.
const DataDir = "checkpoint"

// How shards are made reachable from the output directory. ONNX Runtime
// (≥ 1.24) refuses external data that resolves outside the model's directory,
// symlinks followed, so a symlink only serves compilers that read the
// checkpoint themselves; a hard link is the same file under a second name,
// inside the directory, with nothing copied.
const (
	LinkHard    = "hardlink"
	LinkCopy    = "copy"
	LinkSymlink = "symlink"
)

// LinkModes lists the accepted --link values.
var LinkModes = []string{LinkHard, LinkCopy, LinkSymlink}

// LinkShard makes dst reach src by mode. An existing dst that already is src
// (a re-export) is kept; any other is replaced.
func LinkShard(src, dst, mode string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if same(src, dst, mode) {
		return nil
	}
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	switch mode {
	case LinkHard:
		return hardLink(src, dst)
	case LinkSymlink:
		return os.Symlink(src, dst)
	case LinkCopy:
		return copyFile(src, dst)
	default:
		return fmt.Errorf("unknown link mode %q", mode)
	}
}

func same(src, dst, mode string) bool {
	if mode == LinkCopy {
		return false
	}
	if mode == LinkSymlink {
		target, err := os.Readlink(dst)
		return err == nil && target == src
	}
	a, errA := os.Stat(src)
	b, errB := os.Lstat(dst)
	return errA == nil && errB == nil && os.SameFile(a, b)
}

func hardLink(src, dst string) error {
	err := os.Link(src, dst)
	if errors.Is(err, syscall.EXDEV) {
		return fmt.Errorf("cannot hard-link %s into %s: they are on different filesystems; "+
			"put --out on the checkpoint's filesystem, or pass --link copy (copies the shards) "+
			"or --link symlink (for compilers that read the checkpoint themselves; ONNX Runtime refuses it)", src, filepath.Dir(dst))
	}
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("cannot hard-link %s into %s (%w): the filesystem or permissions forbid it; pass --link copy or --link symlink", src, filepath.Dir(dst), err)
	}
	return err
}

// copyFile copies through a temporary name so a half-copied shard never
// sits under the final name.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), atomic.TempPrefix+"copy-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
