// Package outdir owns strata's output directories. strata replaces or
// deletes only what it provably wrote: every file, directory and link it
// makes is recorded, with what identifies it (device, inode, type, size,
// mtime), in a manifest inside the directory. An entry is strata's only while
// what is on disk still is what was recorded; a name alone proves nothing.
//
// Everything inside the directory is reached component by component with
// O_NOFOLLOW (openat, linkat, renameat, unlinkat), so no write or delete is
// ever led out of the directory through a symlink. New files are written
// under a temporary name, recorded, then renamed into place: a run killed at
// any point leaves either the old file or the new one, both recorded. A lock
// keeps two strata processes from writing one directory at once.
//
// Typical use:
//
//	d, err := outdir.Open(ctx, "out", outdir.Options{Tool: "export", Sources: []string{ckptDir}})
//	defer d.Close()
//	f, err := d.Create("model.onnx") // write f, then f.Commit()
package outdir

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	istrata "github.com/strata-llm/strata/internal/atomic"
)

// Control files of an output directory. They are strata's by construction
// (reserved names, only touched under the lock, never followed).
const (
	ManifestFile = ".strata-owned.json"
	LockFile     = ".strata-lock"
	manifestNew  = ".strata-owned.json.new"
	// manifestLock serialises manifest updates of shared writers.
	manifestLock = ".strata-owned.lock"
	// tempPrefix starts every temporary name; the session id after it is
	// recorded in the manifest before any temporary file is made, so a
	// temporary file left by a killed run is provably strata's.
	tempPrefix = ".strata-tmp-"
)

const (
	manifestFormat  = "strata.owned"
	manifestVersion = 1
)

// Entry kinds.
const (
	kindFile    = "file"    // written by strata: device, inode, size and mtime must match
	kindDir     = "dir"     // made by strata: device and inode must match
	kindLink    = "link"    // a hard link strata made to a source file: device and inode
	kindSymlink = "symlink" // a symlink strata made: device, inode and target
)

// Entry identifies one thing strata made.
type Entry struct {
	Kind    string `json:"kind"`
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size,omitempty"`
	MtimeNs int64  `json:"mtime_ns,omitempty"`
	Target  string `json:"target,omitempty"`
}

type manifest struct {
	Format   string   `json:"format"`
	Version  int      `json:"version"`
	Tool     string   `json:"tool"`
	Sessions []string `json:"sessions,omitempty"`
	// Entries maps a slash-separated path relative to the directory to the
	// identities it may have: two while a replacement is being renamed in.
	Entries map[string][]Entry `json:"entries"`
}

// Options of Open.
type Options struct {
	// Tool is the command that owns the directory ("export",
	// "convert-bin"): a directory another tool wrote is refused.
	Tool string
	// Sources are the files and directories strata reads (the source
	// checkpoint, its shards with symlinks resolved): none may lie inside
	// the output directory, and the output directory may not be one of them.
	Sources []string
	// Outside are directories the output directory may not lie in either
	// (convert: the source checkpoint). Like Sources, judged by what the
	// directories are (device and inode), so neither a symlink nor a bind
	// mount leads the output into them.
	Outside []string
	// Overwrite takes over what the manifest records even if it changed
	// since strata wrote it, where replacing it touches nothing else: a
	// regular file with no other hard link, or a symlink (never followed).
	// Anything the manifest does not record is still refused.
	Overwrite bool
	// Shared lets several processes of one tool write the directory at once
	// (convert's layer ranges, machines sharing a file system): each holds
	// the lock shared, manifest updates merge under a short exclusive lock,
	// and temporary files are cleaned per file (RemoveTempsOf) or when the
	// caller knows no other writer is left (RemoveStaleTemps), never at Open.
	// Identities are matched without the device number, which differs
	// between the clients of a network file system.
	Shared bool
}

// Dir is an open, locked output directory.
type Dir struct {
	path    string // as given, for messages
	abs     string
	fd      int
	lock    *os.File
	tool    string
	session string
	created bool
	shared  bool
	// overwrite: Options.Overwrite.
	overwrite bool
	// changed are the recorded entries that changed since (not taken over).
	changed []string
	// ended is the session Close finished: a shared Save drops it from the
	// sessions on disk.
	ended string
	// lockMade, manifestLockMade: this Open made the lock file (the
	// manifest lock), removed again if it refuses.
	lockMade, manifestLockMade bool
	counter                    atomic.Int64

	mkmu  sync.Mutex // held while making a directory
	mu    sync.Mutex // guards owned, pending and the manifest file
	owned map[string][]Entry
	enc   manifestEncoder // owned as last saved, encoded
	// pending is what this process changed in owned since its last Save:
	// a shared Save replays just that onto the manifest on disk, which
	// holds the other writers' latest.
	pending []change
	dropped map[string]bool // sessions whose temporary files were cleaned
}

// Error is a refusal to use an output directory, with the reason.
type Error struct {
	Dir    string
	Reason string
	Err    error
	// Changed are the entries refused because they changed since strata
	// wrote them (Options.Overwrite would take them over where it can).
	Changed []string
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("output directory %s: %s: %v", e.Dir, e.Reason, e.Err)
	}
	return fmt.Sprintf("output directory %s: %s", e.Dir, e.Reason)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrBusy is wrapped by the error Open returns when another strata process
// holds the directory's lock.
var ErrBusy = errors.New("locked by another strata process")

// Open creates dir if needed, locks it, checks it holds nothing but what
// this tool wrote before (and the source nothing of it), and removes the
// temporary files an earlier, killed run left. Close must be called.
func Open(ctx context.Context, dir string, opts Options) (_ *Dir, err error) {
	if dir == "" {
		return nil, errors.New("no output directory: pass --out DIR")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	d := &Dir{path: dir, abs: abs, fd: -1, tool: opts.Tool, shared: opts.Shared, overwrite: opts.Overwrite && !opts.Shared,
		owned: map[string][]Entry{}, dropped: map[string]bool{}}
	if err := d.checkSources(opts.Sources, opts.Outside); err != nil {
		return nil, err
	}
	info, statErr := os.Stat(abs)
	switch {
	case errors.Is(statErr, fs.ErrNotExist):
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return nil, &Error{Dir: dir, Reason: "cannot be created", Err: err}
		}
		d.created = true
	case errors.Is(statErr, unix.ENOTDIR):
		return nil, &Error{Dir: dir, Reason: "cannot be created (a parent of it is a file, not a directory)", Err: statErr}
	case statErr != nil:
		return nil, &Error{Dir: dir, Reason: "cannot be read", Err: statErr}
	case !info.IsDir():
		return nil, &Error{Dir: dir, Reason: "exists and is not a directory; choose a new or empty directory"}
	}
	defer func() {
		if err != nil {
			if d.lockMade && d.fd >= 0 {
				unix.Unlinkat(d.fd, LockFile, 0)
			}
			if d.manifestLockMade && d.fd >= 0 {
				unix.Unlinkat(d.fd, manifestLock, 0)
			}
			d.release()
			if d.created {
				os.Remove(abs)
			}
		}
	}()
	if d.fd, err = unix.Open(abs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, &Error{Dir: dir, Reason: "cannot be opened", Err: err}
	}
	if err := d.checkControls(); err != nil {
		return nil, err
	}
	if err := d.lockDir(); err != nil {
		return nil, err
	}
	if err := d.adopt(); err != nil {
		return nil, err
	}
	b := make([]byte, 6)
	rand.Read(b)
	d.session = hex.EncodeToString(b)
	if err := d.Save(); err != nil {
		return nil, &Error{Dir: dir, Reason: "is not writable", Err: err}
	}
	return d, nil
}

// adopt takes over what the manifest records and is still on disk as
// recorded, cleans an earlier run's temporary files (not shared: no other
// writer can be running) and refuses anything else in the directory.
// Shared writers do it under the manifest lock, so that no entry another
// writer is placing looks foreign.
func (d *Dir) adopt() error {
	if d.shared {
		unlock, err := d.lockManifest()
		if err != nil {
			return err
		}
		defer unlock()
	}
	m := d.load()
	if m.Tool != "" && m.Tool != d.tool {
		return &Error{Dir: d.path, Reason: fmt.Sprintf("it holds the output of strata %s; strata %s needs a directory of its own (new, empty, or its own earlier output)", m.Tool, d.tool)}
	}
	d.verify(m.Entries)
	if !d.shared {
		d.cleanTemps(m.Sessions)
	}
	return d.checkForeign()
}

// lockManifest takes the exclusive lock of manifest updates (shared mode).
func (d *Dir) lockManifest() (unlock func(), err error) {
	const flags = unix.O_RDWR | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(d.fd, manifestLock, flags|unix.O_CREAT|unix.O_EXCL, 0o644)
	if err == nil {
		d.manifestLockMade = d.session == "" // still in Open
	} else if errors.Is(err, unix.EEXIST) {
		fd, err = unix.Openat(d.fd, manifestLock, flags, 0)
	}
	if err != nil {
		return nil, &Error{Dir: d.path, Reason: "cannot open its lock file " + manifestLock, Err: err}
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, &Error{Dir: d.path, Reason: "cannot be locked", Err: err}
	}
	return func() { unix.Close(fd) }, nil
}

// Path is the directory as given to Open.
func (d *Dir) Path() string { return d.path }

// Abs is the directory's absolute path.
func (d *Dir) Abs() string { return d.abs }

// Available is how many bytes the directory's file system has free for an
// unprivileged writer (statfs's available blocks: the root reserve left
// out, as a write would meet it).
func (d *Dir) Available() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(d.fd, &st); err != nil {
		return 0, fmt.Errorf("%s: reading its file system's free space: %w", d.path, err)
	}
	return available(&st), nil
}

func available(st *unix.Statfs_t) int64 { return int64(st.Bavail) * int64(st.Bsize) }

// AvailableAt is Available for a directory that may not exist yet: the
// free space of the file system of its nearest existing ancestor.
func AvailableAt(dir string) (int64, error) {
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return available(&st), nil
		}
		if !errors.Is(err, unix.ENOENT) || p == filepath.Dir(p) {
			return 0, fmt.Errorf("%s: reading its file system's free space: %w", dir, err)
		}
	}
}

// Join is rel's path under the directory (for messages and readers).
func (d *Dir) Join(rel string) string { return filepath.Join(d.path, filepath.FromSlash(rel)) }

// Created reports whether Open made the directory.
func (d *Dir) Created() bool { return d.created }

// checkSources refuses an output directory that is, or contains,
// something strata reads, or that lies in one of the outside directories.
// One inside the source checkpoint is fine unless the source is outside:
// it is new or strata's own, so nothing of the source can collide with what
// is written. Directories are compared by identity, so a symlink or a bind
// mount is seen through.
func (d *Dir) checkSources(sources, outside []string) error {
	out := resolve(d.abs)
	for _, s := range sources {
		rel, ok := under(out, resolve(s))
		switch {
		case ok && rel == ".":
			return &Error{Dir: d.path, Reason: fmt.Sprintf("it is the source %s (links and mounts resolved); strata never writes into its source: choose another directory", s)}
		case ok:
			return &Error{Dir: d.path, Reason: fmt.Sprintf("it contains the source %s (at %s, links and mounts resolved), which strata must never overwrite or delete: choose a directory outside it", s, rel)}
		}
	}
	for _, s := range outside {
		if rel, ok := under(resolve(s), out); ok {
			return &Error{Dir: d.path, Reason: fmt.Sprintf("it lies inside the source %s (at %s, links and mounts resolved), which strata never writes into: choose a directory outside it", s, rel)}
		}
	}
	return nil
}

// resolve is p absolute with symlinks resolved; a path not there yet keeps
// its missing tail under its resolved existing parent.
func resolve(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return ""
	}
	var tail []string
	for cur := abs; ; cur = filepath.Dir(cur) {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(append([]string{r}, tail...)...)
		}
		if filepath.Dir(cur) == cur {
			return abs
		}
		tail = append([]string{filepath.Base(cur)}, tail...)
	}
}

// under reports whether resolved path p is directory dir or lies inside
// it, and where: dir is compared, by device and inode, with p and each of
// p's existing parents, so that a bind mount of dir (another path to the
// same directory) is seen too.
func under(dir, p string) (string, bool) {
	if dir == "" || p == "" {
		return "", false
	}
	want, err := os.Stat(dir)
	if err != nil || !want.IsDir() {
		rel, ok := lexicallyUnder(dir, p)
		return rel, ok
	}
	var tail []string
	for cur := p; ; cur = filepath.Dir(cur) {
		if got, err := os.Stat(cur); err == nil && os.SameFile(want, got) {
			if len(tail) == 0 {
				return ".", true
			}
			slices.Reverse(tail)
			return filepath.Join(tail...), true
		}
		if filepath.Dir(cur) == cur {
			return "", false
		}
		tail = append(tail, filepath.Base(cur))
	}
}

// lexicallyUnder is under by the paths alone (dir is not there yet).
func lexicallyUnder(dir, p string) (string, bool) {
	rel, err := filepath.Rel(dir, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", false
	}
	return rel, true
}

func (d *Dir) lockDir() error {
	const flags = unix.O_RDWR | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(d.fd, LockFile, flags|unix.O_CREAT|unix.O_EXCL, 0o644)
	if err == nil {
		d.lockMade = true
	} else if errors.Is(err, unix.EEXIST) {
		fd, err = unix.Openat(d.fd, LockFile, flags, 0)
	}
	if err != nil {
		return &Error{Dir: d.path, Reason: "cannot create its lock file " + LockFile, Err: err}
	}
	d.lock = os.NewFile(uintptr(fd), filepath.Join(d.abs, LockFile))
	if why := notOurs(fd); !d.lockMade && why != "" { // swapped since checkControls
		d.lock.Close()
		d.lock = nil
		return foreignControl(d.path, LockFile, why)
	}
	how := unix.LOCK_EX
	if d.shared {
		how = unix.LOCK_SH
	}
	if err := unix.Flock(fd, how|unix.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(d.lock, 64))
		who := ""
		if s := strings.TrimSpace(string(holder)); s != "" {
			who = " (pid " + s + ")"
		}
		d.lock.Close()
		d.lock = nil
		if errors.Is(err, unix.EWOULDBLOCK) {
			return &Error{Dir: d.path, Reason: "another strata process" + who + " is writing into it; wait for it to finish, or choose another directory", Err: ErrBusy}
		}
		return &Error{Dir: d.path, Reason: "cannot be locked", Err: err}
	}
	if !d.shared { // shared holders are many: no one pid to name
		d.lock.Truncate(0)
		d.lock.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0)
	}
	return nil
}

// controlFiles are the control files an output directory may hold, each
// with what strata writes into it: a lock holds nothing or a pid; the
// manifest (and its replacement being written) strata's manifest format.
var controlFiles = []struct {
	name string
	ours func([]byte) bool
}{
	{LockFile, isLockContent},
	{manifestLock, isLockContent},
	{ManifestFile, isManifest},
	{manifestNew, isManifestStart},
}

// checkControls refuses a directory whose control files strata did not
// write, by what they are: a symlink, a special file, a file with other
// hard links (strata would write through it, or remove a name of a file
// elsewhere) or one that holds what strata never writes there.
func (d *Dir) checkControls() error {
	for _, c := range controlFiles {
		// A writer sharing the directory may rename a new manifest over
		// the one opened here: read again what was replaced meanwhile.
		for attempt := 0; ; attempt++ {
			replaced, err := d.checkControl(c.name, c.ours)
			if err != nil {
				return err
			}
			if !replaced {
				break
			}
			if attempt == 3 {
				return foreignControl(d.path, c.name, "keeps being replaced while strata reads it")
			}
		}
	}
	return nil
}

// checkControl checks one control file; replaced says it was renamed over
// (its last link gone) while it was read, so nothing could be told.
func (d *Dir) checkControl(name string, ours func([]byte) bool) (replaced bool, err error) {
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case errors.Is(err, unix.ELOOP):
		return false, foreignControl(d.path, name, "is a symlink")
	case err != nil:
		return false, &Error{Dir: d.path, Reason: "cannot read its control file " + name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	why := notOurs(fd)
	if why == "" {
		data, err := io.ReadAll(io.LimitReader(f, 256<<20))
		if err != nil || !ours(data) {
			why = "does not hold what strata writes there"
		}
	}
	if why != "" && unlinked(fd) {
		return true, nil
	}
	if why != "" {
		return false, foreignControl(d.path, name, why)
	}
	return false, nil
}

// unlinked reports whether the open file fd has no name left (renamed
// over, or removed).
func unlinked(fd int) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Nlink == 0
}

// notOurs says why the open file fd cannot be a control file strata made:
// strata's are regular files with one link.
func notOurs(fd int) string {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "cannot be read: " + err.Error()
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "is not a regular file"
	}
	if st.Nlink != 1 {
		return fmt.Sprintf("has %d hard links (it is also a file elsewhere)", st.Nlink)
	}
	return ""
}

func foreignControl(dir, name, why string) error {
	return &Error{Dir: dir, Reason: fmt.Sprintf("its %s %s, so strata did not write it; strata never writes through, replaces or removes a file it did not write: move it away, or choose another directory", name, why)}
}

// isLockContent: a lock holds nothing, or the pid of its holder.
func isLockContent(data []byte) bool {
	s := strings.TrimSuffix(string(data), "\n")
	return len(s) <= 20 && strings.Trim(s, "0123456789") == ""
}

func isManifest(data []byte) bool {
	var m manifest
	return json.Unmarshal(data, &m) == nil && m.Format == manifestFormat && m.Version == manifestVersion
}

// isManifestStart: a manifest strata was writing when it was killed
// (json.Marshal's field order: format first).
func isManifestStart(data []byte) bool {
	head := `{"format":"` + manifestFormat + `"`
	n := min(len(data), len(head))
	return string(data[:n]) == head[:n]
}

// load reads the manifest; a missing or unreadable one owns nothing.
func (d *Dir) load() manifest {
	var m manifest
	data, err := d.readControl(ManifestFile)
	if err != nil || json.Unmarshal(data, &m) != nil || m.Format != manifestFormat || m.Version != manifestVersion {
		return manifest{}
	}
	return m
}

func (d *Dir) readControl(name string) ([]byte, error) {
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	return io.ReadAll(io.LimitReader(f, 256<<20))
}

// verify keeps, of the recorded entries, those still on disk as recorded,
// reached without following a link.
func (d *Dir) verify(entries map[string][]Entry) {
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths) // parents first
	for _, p := range paths {
		if !validRel(p) {
			continue
		}
		if dir := path.Dir(p); dir != "." && !d.isDir(dir) {
			continue
		}
		got, err := d.lstat(p)
		if err != nil {
			if d.shared && errors.Is(err, unix.ENOENT) {
				// Another writer may be about to rename it into place;
				// an absent entry claims nothing on disk.
				d.owned[p] = entries[p]
			}
			continue
		}
		for _, want := range entries[p] {
			if d.matches(want, got) {
				d.owned[p] = []Entry{want}
				break
			}
		}
		switch {
		case d.owned[p] != nil:
		case d.overwrite && d.replaceable(p, entries[p][0], got):
			d.owned[p] = []Entry{got}
		default:
			d.changed = append(d.changed, p)
		}
	}
}

// replaceable reports whether rel, recorded as want and found as got, may
// be replaced although it changed: renaming over (or unlinking) it then
// touches nothing but that name.
func (d *Dir) replaceable(rel string, want, got Entry) bool {
	if want.Kind == kindDir || want.Kind == kindTree {
		return false // what it holds now is not known to be strata's
	}
	if got.Kind == kindSymlink {
		return true
	}
	if got.Kind != kindFile {
		return false
	}
	dirfd, base, err := d.parent(rel, false)
	if err != nil {
		return false
	}
	defer d.closeParent(dirfd)
	var st unix.Stat_t
	return unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Nlink == 1
}

func (d *Dir) isDir(rel string) bool {
	e, ok := d.owned[rel]
	return ok && e[0].Kind == kindDir
}

func validRel(p string) bool {
	return p != "" && p != "." && fs.ValidPath(p) && !strings.HasPrefix(path.Base(p), ".strata-")
}

// matches compares a recorded identity with what is on disk.
func (d *Dir) matches(want, got Entry) bool {
	if d.shared {
		got.Dev = want.Dev
	}
	if want.Dev != got.Dev || want.Ino != got.Ino {
		return false
	}
	switch want.Kind {
	case kindDir, kindTree:
		return got.Kind == kindDir
	case kindLink:
		return got.Kind == kindFile
	case kindSymlink:
		return got.Kind == kindSymlink && got.Target == want.Target
	case kindFile:
		return got.Kind == kindFile && got.Size == want.Size && got.MtimeNs == want.MtimeNs
	}
	return false
}

// lstat identifies rel without following links (its parents are strata's
// directories, opened with O_NOFOLLOW).
func (d *Dir) lstat(rel string) (Entry, error) {
	dirfd, base, err := d.parent(rel, false)
	if err != nil {
		return Entry{}, err
	}
	defer d.closeParent(dirfd)
	return statAt(dirfd, base)
}

func statAt(dirfd int, name string) (Entry, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Entry{}, err
	}
	e := Entry{Dev: uint64(st.Dev), Ino: uint64(st.Ino), Size: st.Size, MtimeNs: st.Mtim.Nano()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Kind = kindFile
	case unix.S_IFDIR:
		e.Kind, e.Size, e.MtimeNs = kindDir, 0, 0
	case unix.S_IFLNK:
		e.Kind = kindSymlink
		buf := make([]byte, 4096)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return Entry{}, err
		}
		e.Target, e.Size, e.MtimeNs = string(buf[:n]), 0, 0
	default:
		e.Kind = "special"
	}
	return e, nil
}

// parent opens rel's parent directory inside d, each component with
// O_NOFOLLOW; with create, missing directories are made (and recorded).
// Every existing component must be a directory strata made.
func (d *Dir) parent(rel string, create bool) (int, string, error) {
	if !fs.ValidPath(rel) || rel == "." {
		return -1, "", fmt.Errorf("%q is not a path inside the output directory", rel)
	}
	dir, base := path.Split(rel)
	fd := d.fd
	done := ""
	for _, comp := range strings.Split(strings.TrimSuffix(dir, "/"), "/") {
		if comp == "" {
			continue
		}
		done = path.Join(done, comp)
		const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		next, err := unix.Openat(fd, comp, flags, 0)
		if errors.Is(err, unix.ENOENT) && create {
			// One goroutine at a time makes directories: a rename onto
			// another's fresh empty directory would replace it.
			d.mkmu.Lock()
			if next, err = unix.Openat(fd, comp, flags, 0); errors.Is(err, unix.ENOENT) {
				if err = d.mkdirAt(fd, comp, done); err == nil {
					next, err = unix.Openat(fd, comp, flags, 0)
				}
			}
			d.mkmu.Unlock()
		}
		if fd != d.fd {
			unix.Close(fd)
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, "", fmt.Errorf("%s in %s is a symlink or not a directory; strata never follows links inside its output: remove it, or choose another directory", done, d.path)
		}
		if err != nil {
			return -1, "", err
		}
		fd = next
		if create && !d.ownedDir(done) && !(d.shared && d.refreshOwnsDir(done)) {
			unix.Close(fd)
			return -1, "", fmt.Errorf("%s in %s is a directory strata did not make; remove it, or choose another directory", done, d.path)
		}
	}
	return fd, base, nil
}

// refreshOwnsDir: another shared writer may have made it.
func (d *Dir) refreshOwnsDir(rel string) bool {
	d.refresh()
	return d.ownedDir(rel)
}

func (d *Dir) ownedDir(rel string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.isDir(rel)
}

func (d *Dir) closeParent(fd int) {
	if fd != d.fd && fd >= 0 {
		unix.Close(fd)
	}
}

// mkdirAt makes directory name in dirfd (rel inside d): made under a
// temporary name, recorded, then renamed, so it is strata's from the moment
// it bears its name.
func (d *Dir) mkdirAt(dirfd int, name, rel string) error {
	tmp := d.tempName(name)
	if err := unix.Mkdirat(dirfd, tmp, 0o755); err != nil {
		return err
	}
	e, err := statAt(dirfd, tmp)
	if err == nil {
		err = d.record(rel, e, true)
	}
	if err == nil {
		err = renameNoReplace(dirfd, tmp, name)
	}
	if err != nil {
		unix.Unlinkat(dirfd, tmp, unix.AT_REMOVEDIR)
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
			d.unrecord(rel, e)
			return nil // another writer made it first: the caller opens theirs
		}
		return err
	}
	d.settle(rel, e)
	return nil
}

// renameNoReplace renames a fresh directory into place, never over an
// existing one (rename(2) would replace another writer's empty directory,
// which it may already be writing into). A file system without
// RENAME_NOREPLACE gets a plain rename after a check.
func renameNoReplace(dirfd int, tmp, name string) error {
	err := unix.Renameat2(dirfd, tmp, dirfd, name, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		if _, serr := statAt(dirfd, name); serr == nil {
			return unix.EEXIST
		}
		err = unix.Renameat(dirfd, tmp, dirfd, name)
	}
	return err
}

func (d *Dir) tempName(base string) string {
	if len(base) > 64 {
		base = base[:64]
	}
	return fmt.Sprintf("%s%s-%d-%s", tempPrefix, d.session, d.counter.Add(1), base)
}

// record adds an identity for rel (keeping the old one until settle) and,
// with save, writes the manifest before the entry gets its name.
func (d *Dir) record(rel string, e Entry, save bool) error {
	d.mu.Lock()
	d.pending = append(d.pending, change{rel: rel, add: &e})
	d.owned[rel] = append(d.owned[rel], e)
	d.mu.Unlock()
	if save {
		return d.Save()
	}
	return nil
}

// settle makes e rel's only identity once it is in place.
// A shared directory keeps every identity: another writer may have put
// the same file (the same content) there after this one.
func (d *Dir) settle(rel string, e Entry) {
	if d.shared {
		return
	}
	d.mu.Lock()
	d.owned[rel] = []Entry{e}
	d.mu.Unlock()
}

// change is one edit of owned: add an identity, drop one, or (neither)
// forget the path.
type change struct {
	rel       string
	add, drop *Entry
}

func (c change) apply(owned map[string][]Entry) {
	switch {
	case c.add != nil:
		if !slices.Contains(owned[c.rel], *c.add) {
			owned[c.rel] = append(owned[c.rel], *c.add)
		}
	case c.drop != nil:
		owned[c.rel] = slices.DeleteFunc(owned[c.rel], func(x Entry) bool { return x == *c.drop })
		if len(owned[c.rel]) == 0 {
			delete(owned, c.rel)
		}
	default:
		delete(owned, c.rel)
	}
}

// unrecord drops identity e of rel (one that never got the name).
func (d *Dir) unrecord(rel string, e Entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pending = append(d.pending, change{rel: rel, drop: &e})
	d.owned[rel] = slices.DeleteFunc(d.owned[rel], func(x Entry) bool { return x == e })
	if len(d.owned[rel]) == 0 {
		delete(d.owned, rel)
	}
}

func (d *Dir) forget(rel string) {
	d.mu.Lock()
	delete(d.owned, rel)
	d.pending = append(d.pending, change{rel: rel})
	d.mu.Unlock()
}

// cleanTemps removes the temporary files and directories of earlier
// sessions recorded in the manifest, in the directory and in its
// subdirectories strata made.
func (d *Dir) cleanTemps(sessions []string) {
	if len(sessions) == 0 {
		return
	}
	dirs := []string{"."}
	d.mu.Lock()
	for p, e := range d.owned {
		if e[0].Kind == kindDir {
			dirs = append(dirs, p)
		}
	}
	d.mu.Unlock()
	for _, dir := range dirs {
		d.eachEntry(dir, func(dirfd int, name string) {
			for _, s := range sessions {
				if len(s) >= 8 && strings.HasPrefix(name, tempPrefix+s+"-") {
					if e, err := statAt(dirfd, name); err == nil && (e.Kind == kindFile || e.Kind == kindSymlink) {
						unix.Unlinkat(dirfd, name, 0)
					} else if err == nil && e.Kind == kindDir {
						removeTree(dirfd, name) // a TempDir another program filled
					}
				}
			}
		})
	}
}

// eachEntry calls fn for each name in directory rel.
func (d *Dir) eachEntry(rel string, fn func(dirfd int, name string)) error {
	fd := d.fd
	if rel != "." {
		pfd, _, err := d.parent(rel+"/x", false)
		if err != nil {
			return err
		}
		fd = pfd
	}
	names, err := readNames(fd)
	for _, n := range names {
		fn(fd, n)
	}
	d.closeParent(fd)
	return err
}

// readNames lists directory fd, sorted. It reads through a fresh open, not
// a dup: a dup shares the directory offset, so a second listing through it
// would come back empty.
func readNames(fd int) ([]string, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), ".")
	names, err := f.Readdirnames(-1)
	f.Close()
	sort.Strings(names)
	return names, err
}

// checkForeign refuses a directory holding anything strata did not make
// (or that changed since), at the top or inside strata's directories.
func (d *Dir) checkForeign() error {
	var foreign []string
	var walk func(rel string)
	walk = func(rel string) {
		d.eachEntry(rel, func(_ int, name string) {
			p := name
			if rel != "." {
				p = rel + "/" + name
			}
			switch {
			case rel == "." && (name == ManifestFile || name == LockFile || name == manifestNew || name == manifestLock):
			case strings.HasPrefix(name, tempPrefix):
				// another session's leftovers: never ours to judge, never in the way
			case d.owned[p] == nil:
				foreign = append(foreign, p)
			case d.owned[p][0].Kind == kindDir:
				walk(p)
			}
		})
	}
	walk(".")
	if len(foreign) == 0 {
		return nil
	}
	var changed []string
	for _, p := range foreign {
		if slices.Contains(d.changed, p) {
			changed = append(changed, p)
		}
	}
	more := ""
	if len(foreign) > 3 {
		more = fmt.Sprintf(" and %d more", len(foreign)-3)
		foreign = foreign[:3]
	}
	return &Error{Dir: d.path, Reason: fmt.Sprintf("it already holds %s%s, which strata %s did not write (or which changed since); "+
		"strata replaces only its own files: choose a new or empty directory, or move those away", strings.Join(foreign, ", "), more, d.tool), Changed: changed}
}

// Save writes the manifest (through a temporary name, never followed). A
// shared writer merges it with what the others recorded since.
func (d *Dir) Save() error {
	if d.shared {
		unlock, err := d.lockManifest()
		if err != nil {
			return err
		}
		defer unlock()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var sessions []string
	if d.session != "" {
		sessions = []string{d.session}
	}
	if d.shared {
		sessions = d.mergeDisk()
	}
	m := manifest{Format: manifestFormat, Version: manifestVersion, Tool: d.tool, Sessions: sessions, Entries: d.owned}
	// Compact: it is rewritten before every entry gets its name, and
	// indenting it doubled the cost.
	data, err := d.enc.encode(m)
	if err != nil {
		return err
	}
	unix.Unlinkat(d.fd, manifestNew, 0)
	fd, err := unix.Openat(d.fd, manifestNew, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("writing %s: %w", d.Join(ManifestFile), err)
	}
	f := os.NewFile(uintptr(fd), manifestNew)
	_, err = f.Write(append(data, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(d.fd, manifestNew, d.fd, ManifestFile)
	}
	if err != nil {
		unix.Unlinkat(d.fd, manifestNew, 0)
		return fmt.Errorf("writing %s: %w", d.Join(ManifestFile), err)
	}
	d.pending = nil
	return nil
}

// mergeDisk makes owned the manifest on disk (the other shared writers'
// latest) with this process's changes since its last Save on top, and
// returns the sessions to record: theirs and this one's, while it runs.
// Called with the manifest lock and d.mu held.
func (d *Dir) mergeDisk() []string {
	disk := d.load()
	merged := map[string][]Entry{}
	for p, es := range disk.Entries {
		if validRel(p) {
			merged[p] = es
		}
	}
	for _, c := range d.pending {
		c.apply(merged)
	}
	d.owned = merged
	var sessions []string
	for _, s := range disk.Sessions {
		if s != d.session && s != d.ended && !d.dropped[s] {
			sessions = append(sessions, s)
		}
	}
	if d.session != "" {
		sessions = append(sessions, d.session)
	}
	return sessions
}

// refresh merges what other shared writers recorded since the last Save.
func (d *Dir) refresh() {
	unlock, err := d.lockManifest()
	if err != nil {
		return
	}
	defer unlock()
	d.mu.Lock()
	d.mergeDisk()
	d.mu.Unlock()
}

// Close saves the manifest without a session (no temporary file is left)
// and releases the lock.
func (d *Dir) Close() error {
	if d.fd < 0 {
		return nil
	}
	d.cleanTemps([]string{d.session}) // any an error path left
	d.ended, d.session = d.session, ""
	err := d.Save()
	d.release()
	return err
}

func (d *Dir) release() {
	if d.lock != nil {
		if !d.shared {
			d.lock.Truncate(0)
		}
		d.lock.Close() // releases the flock
		d.lock = nil
	}
	if d.fd >= 0 {
		unix.Close(d.fd)
		d.fd = -1
	}
}

// Discard undoes a failed run: a directory Open created is removed with
// everything strata made in it; a directory that existed is left as it is.
func (d *Dir) Discard() {
	if d.fd < 0 {
		return
	}
	if !d.created {
		d.Close()
		return
	}
	d.cleanTemps([]string{d.session})
	d.RemoveAll(".")
	unix.Unlinkat(d.fd, ManifestFile, 0)
	unix.Unlinkat(d.fd, manifestNew, 0)
	unix.Unlinkat(d.fd, manifestLock, 0)
	unix.Unlinkat(d.fd, LockFile, 0)
	d.release()
	os.Remove(d.abs) // only if empty
}

// DiscardKeeping is Discard, except that a directory Open created is kept,
// as a finished run leaves it (closed, temporary files removed), while
// strata's files under rel are there: what a re-run reuses (an export's
// kept windows) is not thrown away with the failed run. It reports whether
// it kept the directory.
func (d *Dir) DiscardKeeping(rel string) bool {
	if d.fd >= 0 && d.created && len(d.Files(rel)) > 0 {
		d.Close()
		return true
	}
	d.Discard()
	return false
}

// Owned reports whether rel is something strata made and still is as made.
func (d *Dir) Owned(rel string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.owned[rel] != nil
}

// Exists reports whether rel is there (strata's or not), not following links.
func (d *Dir) Exists(rel string) bool {
	_, err := d.lstat(rel)
	return err == nil
}

// MkdirAll makes directory rel and its parents inside d.
func (d *Dir) MkdirAll(rel string) error {
	fd, _, err := d.parent(rel+"/x", true)
	if err != nil {
		return fmt.Errorf("creating %s: %w", d.Join(rel), err)
	}
	d.closeParent(fd)
	return nil
}

// checkReplace fails when name in dirfd exists and is not strata's.
func (d *Dir) checkReplace(dirfd int, base, rel string) (exists bool, err error) {
	got, err := statAt(dirfd, base)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if d.ownsAsIs(rel, got) {
		return true, nil
	}
	if d.shared { // another writer may have made it since
		d.refresh()
		if d.ownsAsIs(rel, got) {
			return true, nil
		}
	}
	return true, fmt.Errorf("%s already exists and strata did not write it (or it changed since); strata replaces only its own files: move it away, or choose another directory", d.Join(rel))
}

// ownsAsIs reports whether got is one of rel's recorded identities.
func (d *Dir) ownsAsIs(rel string, got Entry) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, want := range d.owned[rel] {
		if d.matches(want, got) {
			return true
		}
	}
	return false
}

// File is a file being written under a temporary name.
type File struct {
	*os.File
	d         *Dir
	rel, tmp  string
	dirfd     int
	committed bool
	// noReplace: Commit fails (fs.ErrExist) if rel is there by then.
	noReplace bool
}

// Create starts file rel; nothing bears its name until Commit. Its mode is
// 0644 less the umask.
func (d *Dir) Create(rel string) (*File, error) {
	dirfd, base, err := d.parent(rel, true)
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", d.Join(rel), err)
	}
	if _, err := d.checkReplace(dirfd, base, rel); err != nil {
		d.closeParent(dirfd)
		return nil, err
	}
	tmp := d.tempName(base)
	fd, err := unix.Openat(dirfd, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		d.closeParent(dirfd)
		return nil, fmt.Errorf("writing %s: %w", d.Join(rel), err)
	}
	return &File{File: os.NewFile(uintptr(fd), d.Join(rel)), d: d, rel: rel, tmp: tmp, dirfd: dirfd}, nil
}

// Commit syncs and closes the file, records it, and renames it into place,
// replacing strata's earlier file of that name (never another).
func (f *File) Commit() error { return f.commit(true) }

// CommitUnsynced is Commit without the fsync, for a writer that syncs its
// files together later (a sync per file would make Ctrl-C wait for the disk).
func (f *File) CommitUnsynced() error { return f.commit(false) }

func (f *File) commit(sync bool) (err error) {
	if f.committed {
		return nil
	}
	f.committed = true
	defer f.d.closeParent(f.dirfd)
	defer func() {
		if err != nil {
			unix.Unlinkat(f.dirfd, f.tmp, 0)
			err = fmt.Errorf("writing %s: %w", f.d.Join(f.rel), err)
		}
	}()
	if sync {
		if err := f.File.Sync(); err != nil {
			f.File.Close()
			return err
		}
	}
	if err := f.File.Close(); err != nil {
		return err
	}
	if f.noReplace {
		return f.d.placeNew(f.dirfd, f.tmp, f.rel)
	}
	return f.d.place(f.dirfd, f.tmp, f.rel)
}

// placeNew records tmp's identity under rel and renames it there unless
// something (another writer's file) already is: then fs.ErrExist.
func (d *Dir) placeNew(dirfd int, tmp, rel string) error {
	e, err := statAt(dirfd, tmp)
	if err != nil {
		return err
	}
	if err := d.record(rel, e, true); err != nil {
		return err
	}
	if err := renameNoReplace(dirfd, tmp, path.Base(rel)); err != nil {
		d.unrecord(rel, e)
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("another strata process wrote it first: %w", fs.ErrExist)
		}
		return err
	}
	d.settle(rel, e)
	return nil
}

// place records tmp's identity under rel, then renames it there.
func (d *Dir) place(dirfd int, tmp, rel string) error {
	return d.placeFrom(dirfd, tmp, dirfd, rel)
}

// placeFrom records the identity of srcfd/src under rel (in dirfd), then
// renames it there.
func (d *Dir) placeFrom(srcfd int, src string, dirfd int, rel string) error {
	base := path.Base(rel)
	if _, err := d.checkReplace(dirfd, base, rel); err != nil {
		return err
	}
	e, err := statAt(srcfd, src)
	if err != nil {
		return err
	}
	if e.Kind != kindFile {
		return fmt.Errorf("%s is not a regular file", d.Join(rel))
	}
	if err := d.record(rel, e, true); err != nil {
		return err
	}
	if err := unix.Renameat(srcfd, src, dirfd, base); err != nil {
		return err
	}
	d.settle(rel, e)
	return nil
}

// Abort discards an uncommitted file.
func (f *File) Abort() {
	if f.committed {
		return
	}
	f.committed = true
	f.File.Close()
	unix.Unlinkat(f.dirfd, f.tmp, 0)
	f.d.closeParent(f.dirfd)
}

// WriteFile writes rel atomically.
func (d *Dir) WriteFile(rel string, data []byte) error {
	return d.WriteFileMode(rel, data, 0o644)
}

// WriteFileNew writes rel atomically if nothing has that name by the time
// it is renamed into place; otherwise it writes nothing and the error wraps
// fs.ErrExist: of writers racing to make one file, exactly one does.
func (d *Dir) WriteFileNew(rel string, data []byte) error {
	f, err := d.Create(rel)
	if err != nil {
		return err
	}
	f.noReplace = true
	if _, err := f.Write(data); err != nil {
		f.Abort()
		return fmt.Errorf("writing %s: %w", d.Join(rel), err)
	}
	return f.Commit()
}

// WriteFileOnce makes rel with data unless a writer (another process
// sharing the directory, too) made it first, and returns once rel is in
// place either way; made says which. A writer records a file in the
// directory's manifest before it renames it into place: one that finds rel
// recorded but absent (that writer between the two steps, or killed there)
// tries to make it itself.
func (d *Dir) WriteFileOnce(rel string, data []byte) (made bool, err error) {
	for attempt := 0; ; attempt++ {
		if d.Owned(rel) && d.Exists(rel) {
			return false, nil
		}
		err := d.WriteFileNew(rel, data)
		switch {
		case err == nil:
			return true, nil
		case !errors.Is(err, fs.ErrExist):
			return false, err
		case !d.Owned(rel) || attempt == 3:
			// There, and no writer recorded it (the attempt merged what
			// the others recorded): Open says why it is not strata's.
			f, err := d.Open(rel)
			if err != nil {
				return false, err
			}
			f.Close()
			return false, nil
		}
	}
}

// WriteFileUnsynced is WriteFile without the fsync, for a file whose reader
// checks it (by its hash) before trusting it: a crash may leave it torn,
// never under another file's name.
func (d *Dir) WriteFileUnsynced(rel string, data []byte) error {
	return d.writeFile(rel, data, 0o644, false)
}

// WriteFileMode writes rel atomically with mode (less the umask).
func (d *Dir) WriteFileMode(rel string, data []byte, mode os.FileMode) error {
	return d.writeFile(rel, data, mode, true)
}

func (d *Dir) writeFile(rel string, data []byte, mode os.FileMode, sync bool) error {
	f, err := d.Create(rel)
	if err != nil {
		return err
	}
	if mode != 0o644 {
		if err := f.Chmod(mode &^ umask()); err != nil {
			f.Abort()
			return fmt.Errorf("writing %s: %w", d.Join(rel), err)
		}
	}
	if _, err := f.Write(data); err != nil {
		f.Abort()
		return fmt.Errorf("writing %s: %w", d.Join(rel), err)
	}
	return f.commit(sync)
}

// copyChunk is how much is copied between checks for cancellation.
const copyChunk = 8 << 20

// Copy copies r into rel, stopping within a chunk when ctx is cancelled.
func (d *Dir) Copy(ctx context.Context, r io.Reader, rel string) error {
	f, err := d.Create(rel)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			f.Abort()
			return err
		}
		n, err := io.CopyBuffer(f, io.LimitReader(r, copyChunk), buf)
		if err != nil {
			f.Abort()
			return fmt.Errorf("copying into %s: %w", d.Join(rel), err)
		}
		if n < copyChunk {
			break
		}
	}
	return f.Commit()
}

// Remove deletes rel if it is strata's (a directory: with everything in it,
// which must all be strata's). A rel that is not there is no error; one
// strata did not make is an error and stays.
func (d *Dir) Remove(rel string) error {
	dirfd, base, err := d.parent(rel, false)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.closeParent(dirfd)
	exists, err := d.checkReplace(dirfd, base, rel)
	if err != nil || !exists {
		return err
	}
	got, _ := statAt(dirfd, base)
	if got.Kind == kindDir {
		return d.RemoveAll(rel)
	}
	if err := unix.Unlinkat(dirfd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing %s: %w", d.Join(rel), err)
	}
	d.forget(rel)
	return nil
}

// RemoveAll deletes what strata made under rel ("." for everything), then
// rel itself if it is then empty; anything else under rel stays.
func (d *Dir) RemoveAll(rel string) error {
	var paths []string
	d.mu.Lock()
	for p := range d.owned {
		if rel == "." || p == rel || strings.HasPrefix(p, rel+"/") {
			paths = append(paths, p)
		}
	}
	d.mu.Unlock()
	sort.Sort(sort.Reverse(sort.StringSlice(paths))) // children before parents
	var first error
	for _, p := range paths {
		dirfd, base, err := d.parent(p, false)
		if err == nil {
			var exists bool
			if exists, err = d.checkReplace(dirfd, base, p); err == nil && exists {
				flags := 0
				if d.isDirLocked(p) {
					flags = unix.AT_REMOVEDIR
				}
				if d.isTree(p) {
					err = removeTree(dirfd, base)
				} else {
					err = unix.Unlinkat(dirfd, base, flags)
				}
				if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
					err = fmt.Errorf("%s holds files strata did not write; left in place", d.Join(p))
				}
			}
			d.closeParent(dirfd)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			if first == nil {
				first = fmt.Errorf("removing %s: %w", d.Join(p), err)
			}
			continue
		}
		d.forget(p)
	}
	return first
}

func (d *Dir) isTree(rel string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.owned[rel]
	return ok && e[0].Kind == kindTree
}

func (d *Dir) isDirLocked(rel string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.isDir(rel)
}

// Prune removes strata's files under directory rel that keep does not name
// (slash-separated paths relative to d).
func (d *Dir) Prune(rel string, keep map[string]bool) error {
	var paths []string
	d.mu.Lock()
	for p, e := range d.owned {
		if strings.HasPrefix(p, rel+"/") && e[0].Kind != kindDir && e[0].Kind != kindTree && !keep[p] {
			paths = append(paths, p)
		}
	}
	d.mu.Unlock()
	sort.Strings(paths)
	for _, p := range paths {
		if err := d.Remove(p); err != nil {
			return err
		}
	}
	return nil
}

// Files lists strata's files (not directories) under rel, sorted.
func (d *Dir) Files(rel string) []string {
	var out []string
	d.mu.Lock()
	for p, e := range d.owned {
		if (rel == "." || strings.HasPrefix(p, rel+"/")) && e[0].Kind != kindDir && e[0].Kind != kindTree {
			out = append(out, p)
		}
	}
	d.mu.Unlock()
	sort.Strings(out)
	return out
}

// ReadFile reads strata's file rel, without following links.
func (d *Dir) ReadFile(rel string) ([]byte, error) {
	f, err := d.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// Sync flushes strata's file rel (written unsynced) to disk.
func (d *Dir) Sync(rel string) error {
	f, err := d.Open(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", d.Join(rel), err)
	}
	return nil
}

// Open opens strata's regular file rel for reading, without following
// links; a file strata did not write (or that changed since) is refused.
func (d *Dir) Open(rel string) (*os.File, error) {
	dirfd, base, err := d.parent(rel, false)
	if err != nil {
		return nil, err
	}
	defer d.closeParent(dirfd)
	fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.Join(rel), Err: err}
	}
	f := os.NewFile(uintptr(fd), d.Join(rel))
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", d.Join(rel))
	}
	got := Entry{Kind: kindFile, Dev: uint64(st.Dev), Ino: uint64(st.Ino), Size: st.Size, MtimeNs: st.Mtim.Nano()}
	if !d.ownsAsIs(rel, got) && !(d.shared && d.refreshOwns(rel, got)) {
		f.Close()
		return nil, fmt.Errorf("%s is not a file strata wrote (or it changed since); move it away, or choose another directory", d.Join(rel))
	}
	return f, nil
}

func (d *Dir) refreshOwns(rel string, got Entry) bool {
	d.refresh()
	return d.ownsAsIs(rel, got)
}

// RemoveTempsOf removes the temporary files of rel that any recorded
// session left (a killed writer's); for a shared directory, where each
// file has one writer at a time, it is how those files get cleaned.
func (d *Dir) RemoveTempsOf(rel string) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	if len(base) > 64 {
		base = base[:64]
	}
	sessions := d.sessionsOnDisk()
	d.eachEntry(dir, func(dirfd int, name string) {
		for _, s := range sessions {
			if s != d.session && len(s) >= 8 && strings.HasPrefix(name, tempPrefix+s+"-") && strings.HasSuffix(name, "-"+base) {
				if e, err := statAt(dirfd, name); err == nil && e.Kind == kindFile {
					unix.Unlinkat(dirfd, name, 0)
				}
			}
		}
	})
}

// RemoveStaleTemps removes the temporary files of every other recorded
// session: for a shared directory, call it only when no other writer can
// be running (convert's finalize: every layer is done).
func (d *Dir) RemoveStaleTemps() {
	var others []string
	for _, s := range d.sessionsOnDisk() {
		if s != d.session {
			others = append(others, s)
		}
	}
	d.cleanTemps(others)
	d.mu.Lock()
	for _, s := range others {
		d.dropped[s] = true
	}
	d.mu.Unlock()
}

func (d *Dir) sessionsOnDisk() []string {
	if d.shared {
		unlock, err := d.lockManifest()
		if err != nil {
			return nil
		}
		defer unlock()
	}
	return d.load().Sessions
}

func umask() os.FileMode { return istrata.Umask() }
