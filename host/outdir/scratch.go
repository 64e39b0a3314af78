package outdir

import (
	"fmt"
	"os"
)

// Scratch opens a file in the directory for data the command needs only
// while it runs, with no name where the file system allows (Linux's
// O_TMPFILE): a killed run leaves nothing behind, and nothing in the
// directory looks foreign to the next. Elsewhere it is a named file removed
// at once. The caller closes it.
func (d *Dir) Scratch() (*os.File, error) {
	if f, err := openUnnamed(d.path); err == nil {
		return f, nil
	}
	f, err := os.CreateTemp(d.path, ".strata-scratch-*")
	if err != nil {
		return nil, fmt.Errorf("a scratch file in %s: %w", d.path, err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("a scratch file in %s: %w", d.path, err)
	}
	return f, nil
}
