// Package convert re-writes a Hugging Face checkpoint one decoder layer at
// a time: a safetensors shard per decoder layer (MTP layers included, under
// their global index), a tail shard, config.json with a quantisation config
// when quantising, the source's other files, an accounting report, and the
// index last: an index present means the conversion is complete.
//
// Memory is bounded by a few chunks per job, whatever the model's size: a
// tensor is read, transformed and written in slices of its rows. A manifest
// of finished layers (convert-manifest/) makes every run resumable, and
// lets several machines convert disjoint layer ranges into one directory.
package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/outdir"
	meter "github.com/strata-llm/strata/host/progress"
	"github.com/strata-llm/strata/internal/usage"
)

// Output file names.
const (
	IndexFile    = "model.safetensors.index.json"
	TailFile     = "model-tail.safetensors"
	ReportFile   = "convert-report.json"
	ManifestDir  = "convert-manifest"
	runFile      = "run.json"
	formatTag    = "strata-convert/1"
	tailRecord   = "tail.json"
	layerPattern = "model-layer-%05d.safetensors"
)

// LayerFile is the shard name of decoder layer i.
func LayerFile(i int) string { return fmt.Sprintf(layerPattern, i) }

// Range is an inclusive range of decoder layers.
type Range struct{ From, To int }

func (r Range) String() string { return fmt.Sprintf("%d-%d", r.From, r.To) }

// Options control a conversion.
type Options struct {
	DType    string // "", "bfloat16", "float16", "float32"
	Quantize string // "" (as stored), "none" (dequantise), "fp8-block", "fp8-dynamic"
	// Layers limits which decoder layers this run converts; nil: all.
	Layers *Range
	// Task, instead of Layers: this run converts the task's share of the
	// layers (Task.share) and, like Layers, leaves finalizing to --finalize.
	Task *Task
	// FinalizeOnly: with Layers nil, convert no layer; write tail, index and
	// configs if every layer is present. With Layers, convert them, then
	// finalize. (Without either, a run converts everything and finalizes.)
	Finalize bool
	Jobs     int
	// MTP describes the MTP layout (a plugin's Plan); nil: DetectMTP.
	MTP []MTPDescription
	// Progress receives progress output; TTY draws a bar in place.
	Progress io.Writer
	TTY      bool
	// DryRun reports what would be written (Result.Planned) and read
	// (Result.ReadBytes) without opening the output directory.
	DryRun bool
}

// Result is what a run did.
type Result struct {
	Out          string
	Layers       int   // decoder layers of the model (MTP layers included)
	Written      []int // layers written by this run
	Kept         []int // layers already present and kept
	Finalized    bool
	TensorBytes  int64 // bytes written by this run
	Elapsed      time.Duration
	Sources      int // source tensors
	Dropped      int // source tensors deliberately not written
	Outputs      int // tensors in the converted checkpoint
	MTP          *MTP
	Exclusions   []string
	Quantization string
	// A DryRun's files and the source bytes it would read.
	Planned   []PlannedFile
	ReadBytes int64
}

// validate checks option values.
func (o *Options) validate() error {
	switch o.DType {
	case "", "bfloat16", "float16", "float32":
	default:
		return usage.Errorf("--dtype %q: use bfloat16, float16 or float32", o.DType)
	}
	switch o.Quantize {
	case "", QuantNone, QuantFP8Block, QuantFP8Dynamic:
	default:
		return usage.Errorf("--quantize %q: use none, fp8-block or fp8-dynamic", o.Quantize)
	}
	if o.Layers != nil && (o.Layers.From < 0 || o.Layers.To < o.Layers.From) {
		return usage.Errorf("--layers %s: give FIRST-LAST with 0 ≤ FIRST ≤ LAST", o.Layers)
	}
	if o.Task != nil && (o.Layers != nil || o.Task.Count < 1 || o.Task.Index < 0 || o.Task.Index >= o.Task.Count) {
		return usage.Errorf("%s: a task index must be 0 ≤ index < count, without --layers FIRST-LAST", o.Task)
	}
	if o.Jobs <= 0 {
		o.Jobs = 1
	}
	return nil
}

// Convert converts the checkpoint in src into out.
func Convert(ctx context.Context, src, out string, opts Options) (*Result, error) {
	start := time.Now()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	inv, err := openInventory(src)
	if err != nil {
		return nil, err
	}
	descs := opts.MTP
	if descs == nil {
		if descs, err = DetectMTP(inv); err != nil {
			return nil, err
		}
	}
	mtp, err := ResolveMTP(inv, descs)
	if err != nil {
		return nil, err
	}
	p, err := makePlan(inv, mtp, opts)
	if err != nil {
		return nil, err
	}
	if len(p.layers) == 0 {
		return nil, fmt.Errorf("%s: no tensor belongs to a decoder layer (model.layers.{i}.*): nothing to convert layer by layer", inv.dir)
	}
	res := &Result{Layers: len(p.layers), MTP: mtp, Exclusions: p.exclusions, Quantization: opts.Quantize}
	todo, err := p.selectLayers()
	if err != nil {
		return nil, err
	}
	whole := opts.Layers == nil && opts.Task == nil
	if whole && !opts.Finalize && len(p.byLayer[-1]) > 0 {
		// A whole run writes the tail (embeddings and head: often the
		// largest shard) alongside the layers rather than after them.
		todo = append([]int{-1}, todo...)
	}
	if opts.DryRun {
		if res.Out, err = filepath.Abs(out); err != nil {
			return nil, err
		}
		return res, p.dryRun(res, todo, whole || opts.Finalize)
	}
	o, err := prepareOut(ctx, inv, out, p)
	if err != nil {
		return nil, err
	}
	defer o.d.Close()
	defer o.release()
	res.Out = o.dir
	if err := o.claim(todo, "wait for it to finish, or convert other --layers"); err != nil {
		return nil, err
	}
	prog := newProgress(opts.Progress, opts.TTY, p, todo)
	defer prog.stop()
	written, kept, err := o.convertLayers(ctx, todo, opts.Jobs, prog)
	res.Written, res.Kept = written, kept
	res.TensorBytes = prog.written.Load()
	if err != nil {
		return res, err
	}
	if (opts.Layers == nil && opts.Task == nil) || opts.Finalize {
		prog.stop()
		// Finalizing reads every shard and may write the tail: no other
		// run may be writing one.
		if err := o.claim(append([]int{-1}, p.layers...), "run --finalize again once it has finished"); err != nil {
			return res, fmt.Errorf("cannot finalize yet: %w", err)
		}
		if err := o.finalize(ctx, res); err != nil {
			return res, err
		}
		res.Finalized = true
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// selectLayers is the layers this run converts.
func (p *plan) selectLayers() ([]int, error) {
	if t := p.opts.Task; t != nil {
		return t.share(p.layers), nil
	}
	if p.opts.Layers == nil {
		if p.opts.Finalize {
			return nil, nil
		}
		return p.layers, nil
	}
	r := *p.opts.Layers
	last := p.layers[len(p.layers)-1]
	if r.To > last {
		return nil, fmt.Errorf("--layers %s is outside the model: its decoder layers are %s (%s); give a range within it", r, compactRange(p.layers), p.layerSummary())
	}
	var out []int
	for _, l := range p.layers {
		if l >= r.From && l <= r.To {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--layers %s holds no decoder layer of the model (its layers are %s)", r, compactRange(p.layers))
	}
	return out, nil
}

func (p *plan) layerSummary() string {
	mtp := 0
	for _, l := range p.layers {
		if slices.Contains(p.mtp.Layers, l) {
			mtp++
		}
	}
	s := fmt.Sprintf("%d decoder layers", len(p.layers)-mtp)
	if mtp > 0 {
		s += fmt.Sprintf(" + %d MTP", mtp)
	}
	return s
}

// compactRange writes sorted ints as "0-3, 5, 7-9".
func compactRange(xs []int) string {
	var parts []string
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(xs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", xs[i], xs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

// outDir is the output directory of a run.
type outDir struct {
	d   *outdir.Dir
	dir string // absolute, for messages
	p   *plan
	run runInfo
	// lock is LayersLock, open while this run holds layers (claim).
	lock *os.File
}

// runInfo identifies a conversion: the same source headers, config and
// options give the same fingerprint, on any machine.
type runInfo struct {
	Format      string           `json:"format"`
	Fingerprint string           `json:"fingerprint"`
	Source      string           `json:"source"` // the source directory's base name
	DType       string           `json:"dtype,omitempty"`
	Quantize    string           `json:"quantize,omitempty"`
	Layers      []int            `json:"layers"`
	MTP         []MTPDescription `json:"mtp"`
}

// String names the conversion as its options say: `of model, --dtype
// float16, --quantize none`.
func (r runInfo) String() string {
	opt := func(v string) string {
		if v == "" {
			return "not given"
		}
		return v
	}
	return fmt.Sprintf("of %s, --dtype %s, --quantize %s", r.Source, opt(r.DType), opt(r.Quantize))
}

func (p *plan) runInfo() runInfo {
	h := sha256.New()
	fmt.Fprintf(h, "%s\ndtype=%s\nquantize=%s\n", formatTag, p.opts.DType, p.opts.Quantize)
	h.Write(p.inv.configRaw)
	for _, k := range p.inv.keys {
		s := p.inv.tensors[k]
		fmt.Fprintf(h, "\n%s %s %v %s %d", k, s.DType, s.Shape, s.Shard, s.Length)
	}
	descs, _ := json.Marshal(p.mtp.Descriptions)
	h.Write(descs)
	return runInfo{Format: formatTag, Fingerprint: hex.EncodeToString(h.Sum(nil)), Source: filepath.Base(p.inv.dir),
		DType: p.opts.DType, Quantize: p.opts.Quantize, Layers: p.layers, MTP: p.mtp.Descriptions}
}

// prepareOut opens out for this conversion: new, empty, or holding this
// very conversion (same fingerprint), never the source. The directory is
// strata's (host/outdir): only files a conversion wrote there are replaced
// or deleted, nothing inside is reached through a link, and it is opened
// shared, so that runs of disjoint --layers (on machines sharing the file
// system, too) write into it at once.
func prepareOut(ctx context.Context, inv *inventory, out string, p *plan) (_ *outDir, err error) {
	d, err := outdir.Open(ctx, out, outdir.Options{Tool: "convert", Shared: true, Sources: inv.sources(), Outside: inv.dirs()})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	o := &outDir{d: d, dir: d.Abs(), p: p, run: p.runInfo()}
	runRel := ManifestDir + "/" + runFile
	// Runs of --layers starting at once race to make it: one does, the
	// others compare their options with the winner's.
	made := false
	err = writeJSONWith(func(rel string, data []byte) (err error) {
		made, err = d.WriteFileOnce(rel, data)
		return err
	}, runRel, o.run)
	if err != nil || made {
		return o, err
	}
	data, err := d.ReadFile(runRel)
	if err != nil {
		return nil, err
	}
	var prev runInfo
	if err := json.Unmarshal(data, &prev); err != nil || prev.Format != formatTag {
		return nil, fmt.Errorf("%s: not a strata conversion manifest (%v): use a new --out", d.Join(runRel), err)
	}
	if prev.Fingerprint != o.run.Fingerprint {
		return nil, fmt.Errorf("--out %s holds another conversion (%s) and this run is %s (or the source headers differ): it will not be mixed with this one; use a new --out, or re-run with that conversion's source and options to resume it", out, prev, o.run)
	}
	return o, nil
}

// layerRecord is the manifest entry of a finished shard.
type layerRecord struct {
	Fingerprint string        `json:"fingerprint"`
	Layer       int           `json:"layer"` // -1: the tail
	Shard       shardResult   `json:"shard"`
	Tensors     []*accounting `json:"tensors"`
}

func recordName(layer int) string {
	if layer < 0 {
		return tailRecord
	}
	return fmt.Sprintf("layer-%05d.json", layer)
}

func shardName(layer int) string {
	if layer < 0 {
		return TailFile
	}
	return LayerFile(layer)
}

// expected is the header hash and size the shard of a layer must have.
func (o *outDir) expected(layer int) (shardResult, error) {
	var entries []checkpoint.Entry
	for _, g := range o.p.byLayer[layer] {
		entries = append(entries, g.Outputs...)
	}
	return expectedShard(shardName(layer), entries)
}

// done reports whether the layer's shard and record are present and match
// this conversion.
func (o *outDir) done(layer int) bool {
	data, err := o.d.ReadFile(ManifestDir + "/" + recordName(layer))
	if err != nil {
		return false
	}
	var rec layerRecord
	if json.Unmarshal(data, &rec) != nil || rec.Fingerprint != o.run.Fingerprint {
		return false
	}
	want, err := o.expected(layer)
	if err != nil || rec.Shard.HeaderHash != want.HeaderHash || rec.Shard.Size != want.Size {
		return false
	}
	got, err := o.shardOnDisk(shardName(layer))
	return err == nil && got.HeaderHash == want.HeaderHash && got.Size == want.Size
}

// accountsOf lists the accounting of the source tensors of a layer.
func (p *plan) accountsOf(layer int) []*accounting {
	var out []*accounting
	for _, k := range p.inv.keys {
		if l, _ := layerOf(k); l == layer || layer < 0 && !slices.Contains(p.layers, l) {
			out = append(out, p.accounts[k])
		}
	}
	return out
}

// writeLayer writes a layer's (or the tail's) shard, then its record.
func (o *outDir) writeLayer(ctx context.Context, layer int, written *atomic.Int64) error {
	name := shardName(layer)
	o.d.RemoveTempsOf(name) // a killed run's: only this run writes this shard
	res, err := writeShard(ctx, o.d, name, o.p.byLayer[layer], written)
	if err != nil {
		return err
	}
	accts := o.p.accountsOf(layer)
	for _, a := range accts {
		if len(a.Outputs) > 0 {
			a.Into = name
		}
	}
	rec := layerRecord{Fingerprint: o.run.Fingerprint, Layer: layer, Shard: res, Tensors: accts}
	return writeJSON(o.d, ManifestDir+"/"+recordName(layer), rec)
}

// room refuses the shards of pending layers when the output's file system
// has less free space than they hold, before the first is written (a
// flagship is hundreds of GB; a full disk found hours in costs the hours).
// Free space it cannot read is no reason to refuse.
func (o *outDir) room(pending []int, kept int) error {
	var need int64
	for _, l := range pending {
		sh, err := o.expected(l)
		if err != nil {
			return err
		}
		need += sh.Size
	}
	free, err := o.d.Available()
	if err != nil || need <= free {
		return nil
	}
	msg := fmt.Sprintf("%d shards to write hold %s and the file system of %s has %s free: free %s there, or convert into a directory on a larger file system",
		len(pending), meter.Bytes(need), o.dir, meter.Bytes(free), meter.Bytes(need-free))
	if kept > 0 {
		msg += fmt.Sprintf("; the %d layers already converted are kept", kept)
	}
	return errors.New(msg)
}

// convertLayers writes every layer of todo that is not already done, -j at
// a time.
func (o *outDir) convertLayers(ctx context.Context, todo []int, jobs int, prog *progress) (written, kept []int, err error) {
	var pending []int
	for _, l := range todo {
		if o.done(l) {
			if l >= 0 {
				kept = append(kept, l)
			}
			prog.keep(l)
		} else {
			pending = append(pending, l)
		}
	}
	if len(pending) == 0 {
		return nil, kept, nil
	}
	if err := o.room(pending, len(kept)); err != nil {
		return nil, kept, err
	}
	// Layers will change: the index no longer describes a complete output.
	if err := o.d.Remove(IndexFile); err != nil {
		return nil, kept, err
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
		next  = make(chan int)
		wg    sync.WaitGroup
	)
	for range min(jobs, len(pending)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := range next {
				err := o.writeLayer(ctx, l, &prog.written)
				mu.Lock()
				if err != nil && first == nil {
					first = err
					cancel()
				}
				if err == nil && l >= 0 {
					written = append(written, l)
				}
				mu.Unlock()
				if err == nil {
					prog.finish(l)
				}
			}
		}()
	}
feed:
	for _, l := range pending {
		select {
		case next <- l:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	sort.Ints(written)
	if first == nil {
		first = ctx.Err()
	}
	if first != nil && errors.Is(first, context.Canceled) && parent.Err() != nil {
		first = fmt.Errorf("interrupted: %d layers finished and kept in %s; run the same command again to resume: %w", len(written)+len(kept), o.dir, context.Canceled)
	}
	return written, kept, first
}
