package export

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
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
// them.
func (o outDir) materialize(ctx context.Context, t *weights.Table) error {
	need := writes{materialized: materializedBytes(t)}
	if err := o.room(o.path(t.DataPath), need); err != nil {
		return err
	}
	meter := progress.Start(o.progress, o.tty, "materialising "+t.DataPath, need.materialized)
	defer meter.Stop()
	err := t.Materialize(ctx, materialOut{o}, meter.Add)
	if diskFull(err) {
		return &fullDiskError{err: err, remedy: fmt.Sprintf("%s needs %s in all: make room for that on the file system of %s, or %s",
			t.DataPath, progress.Bytes(need.materialized), o.Path(), strings.Join(need.remedies(), ", or "))}
	}
	return err
}

// diskFull is a write that failed for want of room (or under a file-size
// limit, which fails the same way).
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EFBIG)
}

// fullDiskError is a write that found no room, with what to do.
type fullDiskError struct {
	err    error
	remedy string
}

func (e *fullDiskError) Error() string { return e.err.Error() + ": " + e.remedy }
func (e *fullDiskError) Unwrap() error { return e.err }

// withRemedy says what to do after a write that found no room anywhere in
// an export (a shard copy, model.onnx), unless it says so already.
func (o outDir) withRemedy(err error) error {
	var said *fullDiskError
	if !diskFull(err) || errors.As(err, &said) {
		return err
	}
	return &fullDiskError{err: err, remedy: fmt.Sprintf("make room on the file system of %s, or export to another --out", o.Path())}
}

// writes is the weight data an export writes: materialised weights and
// copies of shards.
type writes struct{ materialized, copied int64 }

func (w writes) total() int64 { return w.materialized + w.copied }

// String is "X of materialised weights and Y of copied shards", leaving
// out a part that is nothing.
func (w writes) String() string {
	var parts []string
	if w.materialized > 0 {
		parts = append(parts, progress.Bytes(w.materialized)+" of materialised weights")
	}
	if w.copied > 0 {
		parts = append(parts, progress.Bytes(w.copied)+" of copied shards")
	}
	return strings.Join(parts, " and ")
}

// remedies say how to need less room than w.
func (w writes) remedies() []string {
	out := []string{"export to another --out"}
	if w.materialized > 0 {
		out = append(out, "keep --weights reference (the default), which writes no weight data")
	}
	if w.copied > 0 {
		out = append(out, "link the shards rather than copy them (--link auto, on the checkpoint's file system)")
	}
	return out
}

// materializedBytes is the data the tables that materialise write.
func materializedBytes(tables ...*weights.Table) int64 {
	var n int64
	for _, t := range tables {
		if t != nil && t.Materializing() {
			n += t.DataBytes()
		}
	}
	return n
}

// copiedBytes is the size of the shards that specs copy (--link copy),
// each counted once.
func copiedBytes(ckpt *checkpoint.Checkpoint, specs ...*weights.Spec) int64 {
	var n int64
	seen := map[string]bool{}
	for _, spec := range specs {
		for _, f := range spec.Files {
			if sh, ok := ckpt.Shard(f.Source); ok && f.Kind == weights.KindCheckpoint && f.Link == weights.LinkCopy && !seen[f.Path] {
				seen[f.Path] = true
				n += sh.Size
			}
		}
	}
	return n
}

// room refuses writing need into what (a file, or the directory) when the
// output's file system has less free space: a 235B model is hundreds of
// GB, and a full disk found an hour in costs the hour. Free space it
// cannot read is no reason to refuse. A file rewritten goes to a temporary
// file first, so what it replaces does not count as room.
func (o outDir) room(what string, need writes) error {
	if need.total() == 0 {
		return nil
	}
	free, err := o.Available()
	if err != nil || need.total() <= free {
		return nil
	}
	return fmt.Errorf("%s would take %s and the file system of %s has %s free: free %s there, or %s",
		what, need, o.Path(), progress.Bytes(free), progress.Bytes(need.total()-free), strings.Join(need.remedies(), ", or "))
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
	return progress.Start(o.progress, o.tty, "copying shards into "+weights.DataDir+"/", copiedBytes(ckpt, spec))
}
