package outdir

import (
	"os"

	"golang.org/x/sys/unix"
)

// A Link to make in the output directory: rel becomes a hard link to the
// file at Src, or, Symbolic, a symlink holding Src (which strata then
// never follows).
type Link struct {
	Src, Rel string
	Symbolic bool
}

// Link hard-links the regular file src (absolute, outside d) as rel. A rel
// that already is src is kept.
func (d *Dir) Link(src, rel string) error { return d.Links([]Link{{Src: src, Rel: rel}}) }

// Symlink makes rel a symlink to target (which strata then never follows).
func (d *Dir) Symlink(target, rel string) error {
	return d.Links([]Link{{Src: target, Rel: rel, Symbolic: true}})
}

// Links makes each link under a temporary name, records them all in one
// manifest save, then renames them into place: linking a checkpoint's 144
// shards saved the manifest 144 times. A link already in place is left.
// An error is an *os.LinkError naming the link that failed; the links not
// yet renamed are removed. Each link's directory stays open until the
// renames: a caller with thousands passes them in batches.
func (d *Dir) Links(links []Link) error {
	type made struct {
		tempLink
		rel string
	}
	var pending []made
	renamed := 0
	defer func() {
		for i, m := range pending {
			if i >= renamed {
				unix.Unlinkat(m.dirfd, m.tmp, 0)
			}
			d.closeParent(m.dirfd)
		}
	}()
	for _, l := range links {
		m, done, err := d.makeLink(l)
		if err != nil {
			return err
		}
		if !done {
			pending = append(pending, made{m, l.Rel})
			d.record(l.Rel, m.e, false)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	if err := d.Save(); err != nil {
		return err
	}
	for _, m := range pending {
		if err := unix.Renameat(m.dirfd, m.tmp, m.dirfd, m.base); err != nil {
			return &os.LinkError{Op: "rename", Old: m.tmp, New: d.Join(m.rel), Err: err}
		}
		d.settle(m.rel, m.e)
		renamed++
	}
	return nil
}

// tempLink is a link made under a temporary name in its parent.
type tempLink struct {
	dirfd     int
	tmp, base string
	e         Entry
}

// makeLink makes l under a temporary name, or reports it is already in
// place (done; its parent closed).
func (d *Dir) makeLink(l Link) (m tempLink, done bool, err error) {
	dirfd, base, err := d.parent(l.Rel, true)
	if err != nil {
		return m, false, err
	}
	defer func() {
		if err != nil || done {
			d.closeParent(dirfd)
		}
	}()
	exists, err := d.checkReplace(dirfd, base, l.Rel)
	if err != nil {
		return m, false, err
	}
	if exists && d.inPlace(dirfd, base, l) {
		return m, true, nil
	}
	tmp := d.tempName(base)
	op := "link"
	if l.Symbolic {
		op, err = "symlink", unix.Symlinkat(l.Src, dirfd, tmp)
	} else {
		err = unix.Linkat(unix.AT_FDCWD, l.Src, dirfd, tmp, 0)
	}
	if err != nil {
		return m, false, &os.LinkError{Op: op, Old: l.Src, New: d.Join(l.Rel), Err: err}
	}
	e, err := statAt(dirfd, tmp)
	if err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return m, false, err
	}
	if !l.Symbolic {
		e = Entry{Kind: kindLink, Dev: e.Dev, Ino: e.Ino}
	}
	return tempLink{dirfd, tmp, base, e}, false, nil
}

// inPlace reports whether base already is link l.
func (d *Dir) inPlace(dirfd int, base string, l Link) bool {
	got, err := statAt(dirfd, base)
	if err != nil {
		return false
	}
	if l.Symbolic {
		return got.Kind == kindSymlink && got.Target == l.Src
	}
	var st unix.Stat_t
	return unix.Stat(l.Src, &st) == nil && got.Dev == uint64(st.Dev) && got.Ino == uint64(st.Ino)
}
