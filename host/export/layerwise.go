package export

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/host/window"
	"github.com/strata-llm/strata/sdk"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// layerwise exports windows of layers as models of their own (in parallel,
// skipping windows an earlier run left unchanged) and stitches them into
// model.onnx as they land: a window built here is stitched from memory,
// one kept from an earlier run is read back.
func (e *exporter) layerwise() (*Result, error) {
	spans, err := window.Cut(len(e.parts.plan.GetLayers()), e.opts.WindowSize)
	if err != nil {
		return nil, err
	}
	// No model.onnx may sit beside windows of another export.
	if err := e.out.removeModel(); err != nil {
		return nil, err
	}
	if e.writesWindows() {
		if err := e.out.MkdirAll(window.Dir); err != nil {
			return nil, err
		}
	}
	io, err := window.ModelIO{Plan: e.parts.plan, Compute: e.compute,
		Serving: window.Serving{ContinuousBatching: e.opts.ContinuousBatching, CCL: e.opts.CCL}}.Of(window.Whole(int(spans[0].Count)))
	if err != nil {
		return nil, err
	}
	manifest, warning := window.Load(e.out.Path())
	manifest.Model = nil
	st := window.NewStitcher(io)
	st.Reserve(len(e.ckpt.Sorted()))
	st.SpillTo(e.spill)
	written, kept, err := e.exportWindows(spans, manifest, st)
	if err != nil {
		return nil, err
	}
	e.releaseParts()
	model, held, spec, err := st.FinishHeld()
	if err != nil {
		return nil, fmt.Errorf("stitching windows: %w", err)
	}
	e.modelSum = sha256.New()                     // for the manifest
	size, err := e.commit(model, held, spec, nil) // windows wrote their weights
	if err != nil {
		return nil, err
	}
	if err := e.finishWindows(manifest, spec); err != nil {
		return nil, err
	}
	res := e.result(spec, size)
	res.WindowsWritten, res.WindowsKept = written, kept
	if warning != nil {
		res.Notes = append(res.Notes, warning.Error())
	}
	return res, nil
}

// builtWindow is what exporting one window gave: the model as built
// (nil when the file on disk was kept).
type builtWindow struct {
	model *onnxpb.ModelProto
	spec  *weights.Spec
	held  *graph.Held // the model's encoded initializers, when not in it
	err   error
}

// exportWindows writes every window that is not already on disk unchanged,
// Jobs at a time, recording each in the manifest as it lands, and hands
// them to st in layer order.
func (e *exporter) exportWindows(spans []window.Span, m *window.Manifest, st *window.Stitcher) (written, kept []string, err error) {
	var (
		log    = &windowLog{m: m, out: e.out}
		wg     sync.WaitGroup
		failed atomic.Bool
		slots  = make(chan struct{}, e.opts.Jobs)
		// unstitched bounds the windows built but not yet stitched: the
		// stitcher is one goroutine, and windows that outran it held their
		// graphs (12 MB of GLM-4.6-FP8's heap at its peak).
		unstitched = make(chan struct{}, 2*e.opts.Jobs)
		done       = make(chan struct{})
		built      = make([]chan builtWindow, len(spans))
	)
	for i := range built {
		built[i] = make(chan builtWindow, 1)
	}
	launched := make(chan struct{})
	defer func() { // no window runs once this returns
		failed.Store(true)
		close(done)
		<-launched
		wg.Wait()
		if ferr := log.flush(); err == nil {
			err = ferr
		}
	}()
	go func() {
		defer close(launched)
		for i, s := range spans {
			select {
			case unstitched <- struct{}{}:
			case <-done:
			}
			slots <- struct{}{}
			if failed.Load() {
				<-slots
				built[i] <- builtWindow{err: context.Canceled}
				continue
			}
			wg.Add(1)
			go func() {
				defer func() { <-slots; wg.Done() }()
				w := e.exportWindow(s, log)
				if w.err != nil {
					failed.Store(true)
				}
				built[i] <- w
			}()
		}
	}()
	for i, s := range spans {
		w := <-built[i]
		if w.err == nil {
			w.err = e.stitchWindow(st, s, w)
		}
		<-unstitched
		if w.err != nil {
			failed.Store(true)
			return nil, nil, e.firstError(w.err, built[i+1:])
		}
		if w.model == nil {
			kept = append(kept, s.String())
		} else {
			written = append(written, s.String())
		}
	}
	return written, kept, nil
}

// firstError prefers a window's own error to the cancellation of the
// windows after it.
func (e *exporter) firstError(err error, rest []chan builtWindow) error {
	if !errors.Is(err, context.Canceled) {
		return err
	}
	for _, c := range rest {
		select {
		case w := <-c:
			if w.err != nil && !errors.Is(w.err, context.Canceled) {
				return w.err
			}
		default:
		}
	}
	if e.ctx.Err() != nil {
		return e.ctx.Err()
	}
	return err
}

// stitchWindow adds window s to st: as built, or read back when kept.
func (e *exporter) stitchWindow(st *window.Stitcher, s window.Span, w builtWindow) error {
	if err := e.ctx.Err(); err != nil {
		return err
	}
	if w.model == nil {
		data, err := e.out.ReadFile(s.File())
		if err != nil {
			return err
		}
		w.model = &onnxpb.ModelProto{}
		if err := proto.Unmarshal(data, w.model); err != nil {
			return fmt.Errorf("%s: %w", e.out.path(s.File()), err)
		}
	}
	if err := st.Add(window.Model{Span: s, Proto: w.model, Spec: w.spec, Held: w.held}); err != nil {
		return fmt.Errorf("stitching windows: %w", err)
	}
	return nil
}

// writesWindows reports whether the windows are written as files: kept, or
// with materialised weights (costly to redo after an interruption). Else
// they are only stitched: a window of referenced weights is rebuilt in
// about a millisecond, less than writing, hashing and checking its file.
func (e *exporter) writesWindows() bool {
	return e.opts.KeepWindows || e.opts.Weights == weights.Materialize
}

// exportWindow writes one window's model and records it in the manifest,
// unless the manifest shows the same inputs produced the file that is there
// (or, windows not written, only builds it).
func (e *exporter) exportWindow(s window.Span, log *windowLog) builtWindow {
	if err := e.ctx.Err(); err != nil {
		return builtWindow{err: err}
	}
	defer e.releaseBindings(s)
	if !e.writesWindows() {
		_, w := e.buildWindow(s, false)
		return w
	}
	inputs, err := e.windowInputs(s)
	if err != nil {
		return builtWindow{err: err}
	}
	if log.unchanged(s, inputs) {
		return builtWindow{}
	}
	a, w := e.buildWindow(s, true)
	if w.err != nil {
		return w
	}
	data, err := encode(w.model)
	if err != nil {
		return builtWindow{err: err}
	}
	entry := window.Entry{Span: s.String(), First: s.First, Last: s.Last, File: s.File(), Inputs: inputs, Output: window.Hash(data)}
	if a.table.Materializing() {
		if err := e.out.materialize(e.ctx, a.table); err != nil {
			return builtWindow{err: err}
		}
		entry.Files = map[string]string{}
		for _, f := range a.table.DataFiles() {
			sum, err := window.HashFile(e.out.path(f))
			if err != nil {
				return builtWindow{err: err}
			}
			entry.Files[f] = sum
		}
	}
	// Unsynced: a window is reused only when it hashes to what the manifest
	// recorded, and kept windows are synced once the export is done.
	if err := e.out.WriteFileUnsynced(s.File(), data); err != nil {
		return builtWindow{err: err}
	}
	if err := log.record(entry); err != nil {
		return builtWindow{err: err}
	}
	return w
}

// buildWindow assembles window s into a model whose initializers are held
// encoded in its graph (as the stitcher reads them); for a file, its
// metadata holds its spec too.
func (e *exporter) buildWindow(s window.Span, forFile bool) (*assembler, builtWindow) {
	a, err := e.assemble(s, windowDataFile(s), nil)
	if err != nil {
		return nil, builtWindow{err: err}
	}
	spec := e.spec(a.table)
	var inMetadata *weights.Spec
	if forFile {
		inMetadata = spec
	}
	model, held, err := buildModel(a.b, inMetadata, e.plugin, e.opts.Version, &s)
	if err != nil {
		return nil, builtWindow{err: err}
	}
	if !forFile { // stitched from its chunks as they are
		return a, builtWindow{model: model, spec: spec, held: &held}
	}
	if _, err := graph.Hold(model, held); err != nil {
		return nil, builtWindow{err: err}
	}
	return a, builtWindow{model: model, spec: spec}
}

// releaseBindings lets go of the weight bindings of the window's layers
// once it is built (no other window reads them): GLM-4.6's are 7 MB that
// would otherwise sit beside the stitched model.
func (e *exporter) releaseBindings(s window.Span) {
	for _, l := range e.parts.plan.GetLayers()[s.First : s.Last+1] {
		for _, lw := range e.parts.kinds[l.GetKind()].GetWeights() {
			if lw.GetLayer() == l.GetIndex() {
				lw.Bindings = nil
			}
		}
	}
}

// windowLog is the manifest of windows on disk as the windows land.
type windowLog struct {
	mu    sync.Mutex
	m     *window.Manifest
	out   outDir
	saved time.Time // when the manifest was last written
	dirty bool      // windows recorded since
}

// saveEvery is how often the manifest is rewritten while windows land: it
// lets an interrupted export reuse what it wrote, and rewriting it after
// each of GLM-4.6's 93 windows cost a tenth of the export.
const saveEvery = 250 * time.Millisecond

func (l *windowLog) unchanged(s window.Span, inputs string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.Unchanged(l.out.Path(), s, inputs)
}

func (l *windowLog) record(e window.Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m.Record(e)
	l.dirty = true
	if time.Since(l.saved) < saveEvery {
		return nil
	}
	return l.save()
}

// flush writes what was recorded since the last save.
func (l *windowLog) flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.dirty {
		return nil
	}
	return l.save()
}

func (l *windowLog) save() error {
	if err := l.m.Save(l.out); err != nil {
		return err
	}
	l.saved, l.dirty = time.Now(), false
	return nil
}

// windowKey is everything a window's bytes depend on but the header
// entries of the tensors it reads (tensorKey), which are hashed after it.
type windowKey struct {
	Strata, Plugin, PluginVersion string
	ComputeDType, Link, Weights   string
	Subfunctions, CB, CCL         bool
	PluginOptions                 map[string]string
	Checkpoint, ConfigSHA256      string
	Span                          string
	Layers                        int32
}

// tensorKey is a tensor's safetensors header entry and where it lives.
type tensorKey struct {
	Key, Shard, DType string
	Shape             []int64
	Offset, Length    int64
	ShardSize         int64
}

func (e *exporter) windowInputs(s window.Span) (string, error) {
	sum := sha256.Sum256(e.ckpt.ConfigJSON)
	k := windowKey{
		Strata: e.opts.Version, Plugin: e.plugin.Desc.GetName(), PluginVersion: e.plugin.Desc.GetVersion(),
		ComputeDType: e.opts.ComputeDType, Link: e.opts.Link, Weights: e.opts.Weights, Subfunctions: e.opts.Subfunctions, CB: e.opts.ContinuousBatching, CCL: e.opts.CCL, PluginOptions: e.opts.PluginOptions,
		Checkpoint: e.ckpt.Dir, ConfigSHA256: hex.EncodeToString(sum[:]), Span: s.String(), Layers: s.Count,
	}
	keys, err := e.windowTensors(s)
	if err != nil {
		return "", err
	}
	head, err := json.Marshal(k)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(head)
	b := make([]byte, 0, 256)
	for _, key := range keys {
		t, ok := e.ckpt.Tensor(key)
		if !ok {
			return "", fmt.Errorf("tensor %s is bound by the plugin but missing from the checkpoint", key)
		}
		shard, _ := e.ckpt.Shard(t.Shard)
		b = tensorKey{t.Key, t.Shard, t.DType, t.Shape, t.Offset, t.Length, shard.Size}.append(b[:0])
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// append encodes k unambiguously: strings length-prefixed, numbers as
// varints. By hand: JSON for the tensors was a tenth of a layerwise
// GLM-4.6 export.
func (k tensorKey) append(b []byte) []byte {
	for _, s := range [...]string{k.Key, k.Shard, k.DType} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(len(k.Shape)))
	for _, d := range k.Shape {
		b = binary.AppendVarint(b, d)
	}
	for _, v := range [...]int64{k.Offset, k.Length, k.ShardSize} {
		b = binary.AppendVarint(b, v)
	}
	return b
}

// windowTensors lists the checkpoint keys a window reads, in binding order:
// the keys bound as stored and those inside weight expressions.
func (e *exporter) windowTensors(s window.Span) ([]string, error) {
	type part struct {
		resp  *pb.BuildResponse
		layer int32
	}
	var parts []part
	if s.IsFirst() {
		parts = append(parts, part{e.parts.embed, sdk.NonLayer})
	}
	for _, l := range e.parts.plan.GetLayers()[s.First : s.Last+1] {
		parts = append(parts, part{e.parts.kinds[l.GetKind()], l.GetIndex()})
	}
	if s.IsLast() {
		parts = append(parts, part{e.parts.final, sdk.NonLayer})
	}
	var keys []string
	seen := map[string]bool{}
	for _, p := range parts {
		lw, _ := layerBindings(p.resp, p.layer)
		for _, b := range lw.GetBindings() {
			expr, err := weights.BindingExpr(b, e.quant)
			if err != nil {
				return nil, fmt.Errorf("plugin binding for %s: %w", b.GetInput(), err)
			}
			for _, key := range expr.Keys() {
				if !seen[key] {
					seen[key] = true
					keys = append(keys, key)
				}
			}
		}
	}
	return keys, nil
}

// finishWindows makes kept windows runnable (their checkpoint links) or
// removes them, and records the finished model in the manifest.
func (e *exporter) finishWindows(m *window.Manifest, spec *weights.Spec) error {
	if e.opts.KeepWindows {
		for _, w := range m.Windows {
			if err := e.out.Sync(w.File); err != nil {
				return err
			}
		}
		if err := e.out.linkWindowShards(e.ckpt, spec); err != nil {
			return err
		}
	} else {
		if err := e.out.RemoveAll(window.Dir); err != nil {
			return err
		}
		m.Windows = nil
	}
	m.Model = &window.Output{File: ModelFile, SHA256: hex.EncodeToString(e.modelSum.Sum(nil))}
	return m.Save(e.out)
}

// linkWindowShards gives windows/ the same checkpoint/ links as the model,
// so each window file runs on its own: hard links to the output's own
// links (same filesystem by construction), or symlinks to the source.
func (o outDir) linkWindowShards(ckpt *checkpoint.Checkpoint, spec *weights.Spec) error {
	var links []weights.ShardLink
	for _, f := range spec.Files {
		src, mode := filepath.Join(o.Abs(), filepath.FromSlash(f.Path)), weights.LinkHard
		if f.Link == weights.LinkSymlink {
			sh, ok := ckpt.Shard(f.Source)
			if !ok {
				return fmt.Errorf("the spec names shard %s, which the checkpoint does not have", f.Source)
			}
			src, mode = sh.Path, weights.LinkSymlink
		}
		links = append(links, weights.ShardLink{Source: f.Source, Src: src, Rel: window.Dir + "/" + f.Path, Mode: mode})
	}
	if err := weights.LinkShards(context.Background(), o.Dir, links, nil); err != nil {
		return fmt.Errorf("for the windows: %w", err)
	}
	return nil
}

// KeptWindowsError is a failed or interrupted export whose finished windows
// stay in the output directory for the next run to reuse.
type KeptWindowsError struct {
	Err     error
	Windows int
	Dir     string
}

func (e *KeptWindowsError) Error() string {
	return fmt.Sprintf("%v; the %d finished window files stay in %s: the same command reuses them", e.Err, e.Windows, e.Dir)
}

func (e *KeptWindowsError) Unwrap() error { return e.Err }

// discard undoes a failed export; with --keep-windows the windows it
// finished (and the manifest that lets a re-run reuse them) stay, in a
// directory this run made too.
func (o outDir) discard(err error, keepWindows bool) error {
	if !keepWindows {
		o.Discard()
		return err
	}
	n := 0
	for _, f := range o.Files(window.Dir) {
		if filepath.Ext(f) == ".onnx" {
			n++
		}
	}
	o.DiscardKeeping(window.Dir) // an existing directory is kept anyway
	if n == 0 {
		return err
	}
	return &KeptWindowsError{Err: err, Windows: n, Dir: o.Join(window.Dir)}
}
