//go:build !linux

package outdir

import (
	"errors"
	"os"
)

func openUnnamed(string) (*os.File, error) { return nil, errors.ErrUnsupported }
