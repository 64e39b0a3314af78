package outdir

import (
	"os"

	"golang.org/x/sys/unix"
)

// openUnnamed opens an unnamed regular file in dir (O_TMPFILE).
func openUnnamed(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), dir+"/(unnamed scratch file)"), nil
}
