package export

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/host/progress"
	"github.com/strata-llm/strata/host/weights"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// outDir is the export's output directory: strata replaces and deletes in
// it only what it wrote there itself (host/outdir).
type outDir struct {
	*outdir.Dir
	progress io.Writer // nil: no progress shown
	tty      bool
}

func (o outDir) path(name string) string { return o.Join(name) }

// prepareOut opens (creating it if needed) and locks the output directory,
// refusing one that holds anything but strata's earlier export or that
// holds the checkpoint, without changing anything in it.
func prepareOut(ctx context.Context, dir string, ckpt *checkpoint.Checkpoint, opts Options) (outDir, error) {
	sources := []string{ckpt.Dir}
	for _, sh := range ckpt.Shards {
		sources = append(sources, sh.Path)
	}
	d, err := outdir.Open(ctx, dir, outdir.Options{Tool: "export", Sources: sources, Overwrite: opts.Overwrite})
	if err != nil {
		return outDir{}, err
	}
	return outDir{Dir: d, progress: opts.Progress, tty: opts.TTY}, nil
}

// write commits an export: the old model.onnx goes first (a model.onnx
// present means a complete export), then shards, materialised weights (t,
// unless nil), spec, and model.onnx last, whose size it returns.
func (o outDir) write(ctx context.Context, ckpt *checkpoint.Checkpoint, spec *weights.Spec, specFile *outdir.File, model *onnxpb.ModelProto, held graph.Held, t *weights.Table, extra map[string][]byte, sum hash.Hash) (int, error) {
	if err := o.removeModel(); err != nil {
		return 0, err
	}
	if err := o.linkShards(ctx, ckpt, spec); err != nil {
		return 0, err
	}
	if t != nil && t.Materializing() {
		if err := o.materialize(ctx, t); err != nil {
			return 0, err
		}
	}
	if err := o.pruneWeights(spec); err != nil {
		return 0, err
	}
	// The spec is synced and renamed into place while the model is
	// encoded (Kimi-K2's 29 MB: 15–20 ms of fsync), and before model.onnx
	// is: a model.onnx present still means a complete export.
	specCommitted := make(chan error, 1)
	go func() { specCommitted <- specFile.Commit() }()
	waitSpec := sync.OnceValue(func() error { return <-specCommitted })
	defer waitSpec() // no commit outlives write
	for name, data := range extra {
		if err := o.WriteFile(name, data); err != nil {
			return 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return o.writeModel(model, held, sum, waitSpec)
}

// writeModel encodes the model, with the initializers held apart from it,
// straight into model.onnx (graph.WriteModel), committed once before has
// returned nil, and returns its size. sum,
// unless nil, is given the bytes too, on a goroutine of its own: the
// encoding does not wait for the hash (Kimi-K2's 32 MB: 25 ms).
func (o outDir) writeModel(m *onnxpb.ModelProto, held graph.Held, sum hash.Hash, before func() error) (int, error) {
	f, err := o.Create(ModelFile)
	if err != nil {
		return 0, err
	}
	defer f.Abort() // nothing, once committed
	var dst io.Writer = f
	hashed := make(chan struct{})
	if sum != nil {
		pr, pw := io.Pipe()
		go func() {
			defer close(hashed)
			_, err := io.Copy(sum, pr)
			pr.CloseWithError(err) // a hash never fails; a closed pipe stops the copy
		}()
		defer func() { pw.Close(); <-hashed }()
		dst = io.MultiWriter(f, pw)
	} else {
		close(hashed)
	}
	w := bufio.NewWriterSize(dst, 1<<20)
	n, err := graph.WriteModel(w, m, held)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		return 0, fmt.Errorf("writing %s: %w", o.path(ModelFile), err)
	}
	if err := before(); err != nil {
		return 0, err
	}
	return int(n), f.Commit()
}

// materialize writes t's data files (and their index when sharded),
// refusing before the first byte when the output's file system cannot hold
// them: a 235B model is hundreds of GB, and a full disk found an hour in
// costs the hour.
func (o outDir) materialize(ctx context.Context, t *weights.Table) error {
	if err := o.room(o.path(t.DataPath), t); err != nil {
		return err
	}
	need := t.DataBytes()
	meter := progress.Start(o.progress, o.tty, "materialising "+t.DataPath, need)
	defer meter.Stop()
	err := t.Materialize(ctx, materialOut{o}, meter.Add)
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EFBIG) {
		return fmt.Errorf("%w: %s needs %s in all: make room for that on the file system of %s, export to another --out, or keep --weights reference (the default), which writes none", err, t.DataPath, progress.Bytes(need), o.Path())
	}
	return err
}

// room refuses tables' materialised weights (what: where they go) when
// the output's file system has less free space than they hold. Free space
// it cannot read is no reason to refuse.
func (o outDir) room(what string, tables ...*weights.Table) error {
	var need int64
	for _, t := range tables {
		if t != nil && t.Materializing() {
			need += t.DataBytes()
		}
	}
	if need == 0 {
		return nil
	}
	if free, err := o.Available(); err == nil && need > free {
		return &NoSpaceError{What: what, Need: need, Free: free, Dir: o.Path()}
	}
	return nil
}

// NoSpaceError is materialised weights that the output's file system has
// no room for, found before writing them.
type NoSpaceError struct {
	What       string // the data file (or first shard's name)
	Need, Free int64
	Dir        string // the output directory
}

func (e *NoSpaceError) Error() string {
	return fmt.Sprintf("%s would hold %s of weight data and the file system of %s has %s free: free %s there, export to another --out, or keep --weights reference (the default), which writes none",
		e.What, progress.Bytes(e.Need), e.Dir, progress.Bytes(e.Free), progress.Bytes(e.Need-e.Free))
}

// materialOut is the output directory as weights.Table.Materialize writes it.
type materialOut struct{ o outDir }

func (m materialOut) Create(rel string) (checkpoint.Sink, error) { return m.o.Create(rel) }
func (m materialOut) WriteFile(rel string, data []byte) error    { return m.o.WriteFile(rel, data) }
func (m materialOut) Name(rel string) string                     { return m.o.path(rel) }

// pruneWeights removes materialised weight files no weight of spec uses
// (an earlier export's, with other windows, shards or mode); the index of
// sharded files stays with them.
func (o outDir) pruneWeights(spec *weights.Spec) error {
	keep := map[string]bool{}
	for _, f := range spec.Files {
		keep[f.Path] = true
		if idx, ok := weights.IndexOf(f.Path); ok {
			keep[idx] = true
		}
	}
	return o.Prune(WeightsDir, keep)
}

// removeModel removes a previous model.onnx: from now until the new one is
// renamed into place, no model.onnx may look complete.
func (o outDir) removeModel() error {
	if err := o.Remove(ModelFile); err != nil {
		return fmt.Errorf("removing the previous %s: %w", o.path(ModelFile), err)
	}
	return nil
}

// linkShards makes every shard the spec names reachable inside the output
// directory (the shard's own file, a Hugging Face cache link resolved) and
// removes the links a previous export left that this one does not use.
func (o outDir) linkShards(ctx context.Context, ckpt *checkpoint.Checkpoint, spec *weights.Spec) error {
	keep := map[string]bool{}
	meter := o.copyMeter(ckpt, spec)
	defer func() {
		meter.Stop()
		atomic.AddInt64(&ckpt.BytesRead, meter.Done()) // copies read every byte
	}()
	var links []weights.ShardLink
	for _, f := range spec.Files {
		if f.Kind != weights.KindCheckpoint {
			continue
		}
		sh, ok := ckpt.Shard(f.Source)
		if !ok {
			return fmt.Errorf("the spec names shard %s, which the checkpoint does not have", f.Source)
		}
		keep[f.Path] = true
		links = append(links, weights.ShardLink{Source: f.Source, Src: sh.Path, Rel: f.Path, Mode: f.Link})
	}
	if err := weights.LinkShards(ctx, o.Dir, links, meter); err != nil {
		return err
	}
	return o.Prune(weights.DataDir, keep)
}

// copyMeter is the progress of copying the shards --link copy copies (a
// meter that shows nothing for links).
func (o outDir) copyMeter(ckpt *checkpoint.Checkpoint, spec *weights.Spec) *progress.Meter {
	var total int64
	for _, f := range spec.Files {
		if sh, ok := ckpt.Shard(f.Source); ok && f.Kind == weights.KindCheckpoint && f.Link == weights.LinkCopy {
			total += sh.Size
		}
	}
	return progress.Start(o.progress, o.tty, "copying shards into "+weights.DataDir+"/", total)
}
