package export

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/host/window"
	"github.com/strata-llm/strata/internal/atomic"
)

// outDir is a validated, writable output directory.
type outDir struct {
	dir     string
	created bool // by this export: removed again if the export fails
}

func (o outDir) path(name string) string { return filepath.Join(o.dir, filepath.FromSlash(name)) }

// ours are the names an export writes; a directory holding only these (and
// our temporary files) is a previous export and may be overwritten.
var ours = map[string]bool{ModelFile: true, SpecFile: true, weights.QAICSpecFile: true, weights.DataDir: true, WeightsDir: true, window.Dir: true, window.ManifestFile: true}

// prepareOut creates dir if needed and checks it is writable and holds
// nothing but a previous export, without changing anything in it.
func prepareOut(dir string) (outDir, error) {
	if dir == "" {
		return outDir{}, errors.New("no output directory: pass --out DIR")
	}
	_, statErr := os.Stat(dir)
	created := errors.Is(statErr, fs.ErrNotExist)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return outDir{}, fmt.Errorf("output directory %s cannot be created: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return outDir{}, fmt.Errorf("output directory %s: %w", dir, err)
	}
	for _, e := range entries {
		// <name>.onnx: a separate model an earlier export wrote.
		if !ours[e.Name()] && !strings.HasPrefix(e.Name(), atomic.TempPrefix) && !(e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".onnx")) {
			return outDir{}, fmt.Errorf("output directory %s already holds %s, which no strata export wrote; "+
				"choose an empty or new directory (strata overwrites only its own earlier exports)", dir, e.Name())
		}
	}
	probe, err := os.CreateTemp(dir, atomic.TempPrefix+"probe-*")
	if err != nil {
		return outDir{}, fmt.Errorf("output directory %s is not writable: %w", dir, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	return outDir{dir: dir, created: created}, nil
}

// discard removes the directory after a failed export if this export
// created it: everything in it is then ours.
func (o outDir) discard() {
	if o.created {
		os.RemoveAll(o.dir)
	}
}

// write commits an export: the old model.onnx goes first (a model.onnx
// present means a complete export), then shards, materialised weights (t,
// unless nil), spec, and model.onnx last.
func (o outDir) write(ckpt *checkpoint.Checkpoint, spec *weights.Spec, model []byte, t *weights.Table, extra map[string][]byte) error {
	if err := o.removeModel(); err != nil {
		return err
	}
	if err := o.linkShards(ckpt, spec); err != nil {
		return err
	}
	if t != nil && t.Materializing() {
		if err := t.Materialize(o.path(t.DataPath)); err != nil {
			return err
		}
	}
	if err := o.pruneWeights(spec); err != nil {
		return err
	}
	specJSON, err := spec.Marshal()
	if err != nil {
		return err
	}
	if err := atomic.WriteFile(o.path(SpecFile), specJSON); err != nil {
		return err
	}
	for name, data := range extra {
		if err := atomic.WriteFile(o.path(name), data); err != nil {
			return err
		}
	}
	return atomic.WriteFile(o.path(ModelFile), model)
}

// pruneWeights removes materialised weight files no weight of spec uses
// (an earlier export's, with other windows or mode).
func (o outDir) pruneWeights(spec *weights.Spec) error {
	keep := map[string]bool{}
	for _, f := range spec.Files {
		keep[o.path(f.Path)] = true
	}
	dir := o.path(WeightsDir)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || keep[path] {
			return err
		}
		return os.Remove(path)
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// removeModel removes a previous model.onnx: from now until the new one is
// renamed into place, no model.onnx may look complete.
func (o outDir) removeModel() error {
	if err := os.Remove(o.path(ModelFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the previous %s: %w", o.path(ModelFile), err)
	}
	return nil
}

// linkShards makes every shard the spec names reachable inside the output
// directory and removes shards a previous export left that this one does not use.
func (o outDir) linkShards(ckpt *checkpoint.Checkpoint, spec *weights.Spec) error {
	keep := map[string]bool{}
	for _, f := range spec.Files {
		if f.Kind != weights.KindCheckpoint {
			continue
		}
		dst := o.path(f.Path)
		keep[dst] = true
		if err := weights.LinkShard(filepath.Join(ckpt.Dir, f.Source), dst, f.Link); err != nil {
			return fmt.Errorf("linking shard %s: %w", f.Source, err)
		}
	}
	return filepath.WalkDir(o.path(weights.DataDir), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || keep[path] {
			return err
		}
		return os.Remove(path)
	})
}
