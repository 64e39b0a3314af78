// Package atomic writes files so that a reader sees the old content or the
// new, never a part: write a temporary file beside the target, sync, rename.
package atomic

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// TempPrefix starts the names of the temporary files: a directory scan can
// tell them from real outputs.
const TempPrefix = ".strata-"

var (
	umaskOnce sync.Once
	umask     os.FileMode
)

// Umask is the process's file mode creation mask (read once, at first use).
func Umask() os.FileMode {
	umaskOnce.Do(func() {
		m := syscall.Umask(0o022)
		syscall.Umask(m)
		umask = os.FileMode(m)
	})
	return umask
}

// WriteFile writes data to path atomically with mode 0644 less the umask.
func WriteFile(path string, data []byte) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), TempPrefix+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			err = fmt.Errorf("writing %s: %w", path, err)
		}
	}()
	if err = tmp.Chmod(0o644 &^ Umask()); err != nil {
		return err
	}
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
