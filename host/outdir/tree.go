package outdir

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// kindTree is a directory strata does not list: one another program strata
// ran filled (the compiler's binary directory), or a nested output
// directory with a manifest of its own (compile's export/). It is neither
// walked nor written into by this directory; it is replaced whole.
const kindTree = "tree"

// MkdirTree makes rel a tree (see kindTree); one strata made already is kept.
func (d *Dir) MkdirTree(rel string) error {
	dirfd, base, err := d.parent(rel, true)
	if err != nil {
		return fmt.Errorf("creating %s: %w", d.Join(rel), err)
	}
	defer d.closeParent(dirfd)
	exists, err := d.checkReplace(dirfd, base, rel)
	if err != nil {
		return err
	}
	if exists {
		if got, _ := statAt(dirfd, base); got.Kind != kindDir {
			return fmt.Errorf("%s is strata's file, not a directory: remove it", d.Join(rel))
		}
		return nil
	}
	tmp := d.tempName(base)
	if err := unix.Mkdirat(dirfd, tmp, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", d.Join(rel), err)
	}
	return d.placeTree(dirfd, tmp, dirfd, base, rel)
}

// TempDir makes an empty temporary directory inside directory parent (a
// directory strata made, or "."), for another program to write into; it
// goes at Close, or with the next run's cleaning if this one is killed.
// It returns the directory's path inside d and its absolute path.
func (d *Dir) TempDir(parent, hint string) (rel, abs string, err error) {
	dirfd, _, err := d.parent(path.Join(parent, "x"), true)
	if err != nil {
		return "", "", err
	}
	defer d.closeParent(dirfd)
	name := d.tempName(hint)
	if err := unix.Mkdirat(dirfd, name, 0o755); err != nil {
		return "", "", fmt.Errorf("creating a temporary directory in %s: %w", d.Join(parent), err)
	}
	rel = path.Join(parent, name)
	return rel, filepath.Join(d.abs, filepath.FromSlash(rel)), nil
}

// RemoveTemp removes a temporary directory TempDir made, with what is in
// it, never following a link.
func (d *Dir) RemoveTemp(rel string) error {
	dirfd, base, err := d.parent(rel, false)
	if err != nil {
		return err
	}
	defer d.closeParent(dirfd)
	return removeTree(dirfd, base)
}

// AdoptTree moves the directory from (inside a TempDir) to rel as a tree,
// replacing strata's earlier one there in one step (never another's).
func (d *Dir) AdoptTree(from, rel string) error {
	srcfd, srcBase, err := d.parent(from, false)
	if err != nil {
		return err
	}
	defer d.closeParent(srcfd)
	if got, err := statAt(srcfd, srcBase); err != nil || got.Kind != kindDir {
		return fmt.Errorf("%s is not a directory (%v)", d.Join(from), err)
	}
	dirfd, base, err := d.parent(rel, true)
	if err != nil {
		return err
	}
	defer d.closeParent(dirfd)
	return d.placeTree(srcfd, srcBase, dirfd, base, rel)
}

// placeTree records the directory srcfd/src as rel's tree and renames it to
// dirfd/base; strata's earlier entry there is swapped out atomically, then
// removed.
func (d *Dir) placeTree(srcfd int, src string, dirfd int, base, rel string) error {
	exists, err := d.checkReplace(dirfd, base, rel)
	if err != nil {
		return err
	}
	e, err := statAt(srcfd, src)
	if err != nil {
		return err
	}
	e.Kind = kindTree
	if err := d.record(rel, e, true); err != nil {
		return err
	}
	if exists {
		if err := unix.Renameat2(srcfd, src, dirfd, base, unix.RENAME_EXCHANGE); err == nil {
			d.settle(rel, e)
			return removeTree(srcfd, src) // the old one, now at src
		}
		if err := removeTree(dirfd, base); err != nil { // no exchange on this file system
			return err
		}
	}
	if err := unix.Renameat(srcfd, src, dirfd, base); err != nil {
		return err
	}
	d.settle(rel, e)
	return nil
}

// AdoptFile moves the regular file from (inside a TempDir) to rel, replacing
// strata's earlier file there (never another's).
func (d *Dir) AdoptFile(from, rel string) error {
	srcfd, srcBase, err := d.parent(from, false)
	if err != nil {
		return err
	}
	defer d.closeParent(srcfd)
	dirfd, _, err := d.parent(rel, true)
	if err != nil {
		return err
	}
	defer d.closeParent(dirfd)
	return d.placeFrom(srcfd, srcBase, dirfd, rel)
}

// removeTree removes name in dirfd and, when it is a directory, everything
// in it; links are removed, never followed.
func removeTree(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := readNames(fd)
	if err == nil {
		for _, n := range names {
			if err = removeTree(fd, n); err != nil {
				break
			}
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// ErrNoClone is wrapped by Clone's error when the file system cannot share
// a file's blocks between two files (reflink): ext4 for one.
var ErrNoClone = errors.New("the file system cannot clone files (reflink)")

// Clone makes rel a copy-on-write clone of the regular file src (absolute,
// outside d): a file of its own (one link, its own inode) sharing src's
// blocks, so nothing is copied. A file system without reflink, or src on
// another file system, gives an error wrapping ErrNoClone.
func (d *Dir) Clone(src, rel string) error {
	f, err := d.cloneTemp(src, rel)
	if err != nil {
		return err
	}
	return f.CommitUnsynced() // the clone shares blocks already on disk
}

// CanClone tries a clone of src into a temporary file, removed at once:
// nil when Clone would work from src's file system into d.
func (d *Dir) CanClone(src string) error {
	f, err := d.cloneTemp(src, ".strata-probe")
	if err == nil {
		f.Abort()
	}
	return err
}

// cloneTemp clones src into the temporary file of rel.
func (d *Dir) cloneTemp(src, rel string) (*File, error) {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: src, Err: err}
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file", src)
	}
	f, err := d.Create(rel)
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlFileClone(int(f.Fd()), sfd); err != nil {
		f.Abort()
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			return nil, fmt.Errorf("cloning %s as %s: %w: %w", src, d.Join(rel), ErrNoClone, err)
		}
		return nil, fmt.Errorf("cloning %s as %s: %w", src, d.Join(rel), err)
	}
	return f, nil
}

// CanLink tries a hard link of src into a temporary name, removed at once:
// nil when Link would work from src's file system into d.
func (d *Dir) CanLink(src string) error {
	tmp := d.tempName("probe")
	if err := unix.Linkat(unix.AT_FDCWD, src, d.fd, tmp, 0); err != nil {
		return &os.LinkError{Op: "link", Old: src, New: d.Join(tmp), Err: err}
	}
	return unix.Unlinkat(d.fd, tmp, 0)
}
