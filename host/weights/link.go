package weights

import (
	"context"
	"errors"
	"fmt"
	"path"
	"syscall"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/host/progress"
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

// LinkShard makes rel inside d reach the shard file src (absolute, symlinks
// resolved: the file itself, not a Hugging Face cache link to it) by mode.
// An existing rel that already is src (a re-export) is kept; strata's own
// earlier file is replaced; anything else is refused by d. A copy stops
// when ctx is cancelled.
func LinkShard(ctx context.Context, d *outdir.Dir, src, rel, mode string, meter *progress.Meter) error {
	switch mode {
	case LinkHard:
		return hardLink(d, src, rel)
	case LinkSymlink:
		return d.Symlink(src, rel)
	case LinkCopy:
		f, _, err := checkpoint.OpenRegular(src)
		if err != nil {
			return err
		}
		defer f.Close()
		return d.Copy(ctx, meter.Reader(f), rel)
	default:
		return fmt.Errorf("unknown link mode %q", mode)
	}
}

func hardLink(d *outdir.Dir, src, rel string) error {
	err := d.Link(src, rel)
	into := path.Dir(d.Join(rel))
	if errors.Is(err, syscall.EXDEV) {
		return fmt.Errorf("cannot hard-link %s into %s: they are on different filesystems; "+
			"put --out on the checkpoint's filesystem, or pass --link copy (copies the shards) "+
			"or --link symlink (for compilers that read the checkpoint themselves; ONNX Runtime refuses it)", src, into)
	}
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("cannot hard-link %s into %s (%w): the filesystem or permissions forbid it; pass --link copy or --link symlink", src, into, err)
	}
	return err
}
