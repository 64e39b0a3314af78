package checkpoint

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// NotRegularError says a path strata would read as checkpoint data is not a
// regular file (a FIFO, a device, a socket or a directory), which strata
// refuses rather than block on or read without end.
type NotRegularError struct {
	Path string
	Mode fs.FileMode
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("%s is %s, not a regular file: strata reads checkpoint data only from regular files (symlinks to them are fine); replace it with the real file",
		e.Path, describeMode(e.Mode))
}

func describeMode(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "a special file (" + m.String() + ")"
}

// Resolve is path with symlinks resolved, once it is known to lead to a
// regular file: the file a Hugging Face cache's snapshots/<rev>/x link
// points at (../../blobs/<sha>), which is what gets linked or copied.
func Resolve(path string) (string, fs.FileInfo, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", nil, err
	}
	if !info.Mode().IsRegular() {
		return "", nil, &NotRegularError{Path: path, Mode: info.Mode()}
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", nil, err
	}
	if real, err = filepath.Abs(real); err != nil {
		return "", nil, err
	}
	return real, info, nil
}

// OpenRegular opens path for reading only if it is a regular file: it is
// checked before opening, and opened non-blocking so that a FIFO swapped in
// meanwhile cannot hang the open, then checked again.
func OpenRegular(path string) (*os.File, fs.FileInfo, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, nil, &NotRegularError{Path: path, Mode: info.Mode()}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	if info, err = f.Stat(); err != nil || !info.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = &NotRegularError{Path: path, Mode: info.Mode()}
		}
		return nil, nil, err
	}
	return f, info, nil
}

// readRegular reads a whole regular file of at most limit bytes.
func readRegular(path string, limit int64) ([]byte, error) {
	f, info, err := OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d a file of this kind can plausibly be: not the file strata expects", path, info.Size(), limit)
	}
	data := make([]byte, info.Size())
	n, err := f.ReadAt(data, 0)
	if err != nil && n != len(data) {
		return nil, err
	}
	return data, nil
}
