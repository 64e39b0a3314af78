package weights

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"syscall"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/host/progress"
)

// DataDir is the directory, inside the output directory, through which the
// model reaches the checkpoint's shards.
const DataDir = "checkpoint"

// How shards are made reachable from the output directory, and who loads
// the result:
//   - reflink: a copy-on-write clone, a file of its own sharing the
//     shard's blocks (nothing copied; btrfs, XFS, bcachefs, not ext4):
//     ONNX Runtime and the onnx package load it;
//   - hardlink: the same file under a second name (nothing copied, any
//     POSIX file system): ONNX Runtime loads it; the onnx package refuses
//     any external data file with more than one link;
//   - copy: the bytes copied (the disk space and time of the shards): every
//     loader;
//   - symlink: ONNX Runtime (≥ 1.24) and the onnx package refuse external
//     data reached through a link; for compilers that read the checkpoint
//     themselves.
//
// auto, the default, clones where the file system can, hard-links where it
// cannot, and copies when the output is on another file system, saying so.
const (
	LinkAuto    = "auto"
	LinkReflink = "reflink"
	LinkHard    = "hardlink"
	LinkCopy    = "copy"
	LinkSymlink = "symlink"
)

// LinkModes lists the accepted --link values.
var LinkModes = []string{LinkAuto, LinkReflink, LinkHard, LinkCopy, LinkSymlink}

// ResolveAuto chooses what --link auto does for a shard at src into d:
// reflink when a probe clone of src succeeds, else hardlink, with the
// reason to tell the user.
func ResolveAuto(d *outdir.Dir, src string) (mode, reason string) {
	err := d.CanClone(src)
	if err == nil {
		return LinkReflink, ""
	}
	why := err.Error()
	var errno syscall.Errno
	if errors.Is(err, outdir.ErrNoClone) && errors.As(err, &errno) {
		why = fmt.Sprintf("%v: %v", outdir.ErrNoClone, errno)
	}
	if lerr := d.CanLink(src); lerr != nil {
		return LinkCopy, fmt.Sprintf("--link auto: shards copied: they can be neither cloned (%s) nor hard-linked (%v) into the output; put --out on the checkpoint's file system to reference them in place", why, errors.Unwrap(lerr))
	}
	return LinkHard, fmt.Sprintf("--link auto: shards hard-linked, not cloned (%s); ONNX Runtime loads the export, the onnx package refuses hard-linked external data (onnx.load, onnx.checker): pass --link copy for it", why)
}

// LinkShard makes rel inside d reach the shard file src (absolute, symlinks
// resolved: the file itself, not a Hugging Face cache link to it) by mode.
// An existing rel that already is src (a re-export) is kept; strata's own
// earlier file is replaced; anything else is refused by d. A copy stops
// when ctx is cancelled.
func LinkShard(ctx context.Context, d *outdir.Dir, src, rel, mode string, meter *progress.Meter) error {
	switch mode {
	case LinkReflink:
		if err := d.Clone(src, rel); err != nil {
			return fmt.Errorf("%w: pass --link hardlink (ONNX Runtime only) or --link copy", err)
		}
		return nil
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

// ShardLink is a shard file (Src) to reach as Rel inside the output
// directory, by Mode; Source names the shard in errors.
type ShardLink struct {
	Source, Src, Rel, Mode string
}

// LinkShards is LinkShard for many shards: the hard links and symlinks are
// made in batches (outdir.Dir.Links: a manifest save per batch, not one per
// shard), clones and copies one by one.
func LinkShards(ctx context.Context, d *outdir.Dir, shards []ShardLink, meter *progress.Meter) error {
	var batch []outdir.Link
	for _, s := range shards {
		if s.Mode == LinkHard || s.Mode == LinkSymlink {
			batch = append(batch, outdir.Link{Src: s.Src, Rel: s.Rel, Symbolic: s.Mode == LinkSymlink})
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := LinkShard(ctx, d, s.Src, s.Rel, s.Mode, meter); err != nil {
			return fmt.Errorf("linking shard %s: %w", s.Source, err)
		}
	}
	for len(batch) > 0 {
		n := min(len(batch), linkBatch)
		if err := d.Links(batch[:n]); err != nil {
			return explainLink(d, shards, err)
		}
		batch = batch[n:]
	}
	return nil
}

// linkBatch bounds the directories a batch of links holds open.
const linkBatch = 256

// explainLink names the shard whose link failed, and says why for a hard
// link.
func explainLink(d *outdir.Dir, shards []ShardLink, err error) error {
	var lerr *os.LinkError
	if !errors.As(err, &lerr) {
		return err
	}
	for _, s := range shards {
		if s.Src == lerr.Old || d.Join(s.Rel) == lerr.New {
			if s.Mode == LinkHard {
				err = explainHardLink(d, s.Src, s.Rel, err)
			}
			return fmt.Errorf("linking shard %s: %w", s.Source, err)
		}
	}
	return err
}

func hardLink(d *outdir.Dir, src, rel string) error {
	return explainHardLink(d, src, rel, d.Link(src, rel))
}

// explainHardLink says why a hard link failed and what to pass instead.
func explainHardLink(d *outdir.Dir, src, rel string, err error) error {
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
