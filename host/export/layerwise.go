package export

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/host/window"
	"github.com/strata-llm/strata/sdk"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// layerwise exports windows of layers as models of their own (in parallel,
// skipping windows an earlier run left unchanged), then stitches the window
// files into model.onnx.
func (e *exporter) layerwise() (*Result, error) {
	spans, err := window.Cut(len(e.parts.plan.GetLayers()), e.opts.WindowSize)
	if err != nil {
		return nil, err
	}
	// No model.onnx may sit beside windows of another export.
	if err := e.out.removeModel(); err != nil {
		return nil, err
	}
	if err := e.out.MkdirAll(window.Dir); err != nil {
		return nil, err
	}
	manifest, warning := window.Load(e.out.Path())
	manifest.Model = nil
	written, kept, specs, err := e.exportWindows(spans, manifest)
	if err != nil {
		return nil, err
	}
	e.releaseParts()
	model, spec, err := e.stitch(spans, specs)
	if err != nil {
		return nil, err
	}
	size, err := e.commit(model, spec, nil) // windows wrote their weights
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

// exportWindows writes every window that is not already on disk unchanged,
// Jobs at a time, recording each in the manifest as it lands. specs are the
// weight specs of the windows written (nil for those kept).
func (e *exporter) exportWindows(spans []window.Span, m *window.Manifest) (written, kept []string, specs []*weights.Spec, err error) {
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr error
		slots    = make(chan struct{}, e.opts.Jobs)
	)
	done := make([]bool, len(spans))
	specs = make([]*weights.Spec, len(spans))
	for i, s := range spans {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			entry, spec, unchanged, err := e.exportWindow(s, m, &mu)
			mu.Lock()
			defer mu.Unlock()
			if err == nil && !unchanged {
				m.Record(entry)
				err = m.Save(e.out)
			}
			if err != nil && firstErr == nil {
				firstErr = err
			}
			done[i], specs[i] = unchanged, spec
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, nil, nil, firstErr
	}
	for i, s := range spans {
		if done[i] {
			kept = append(kept, s.String())
		} else {
			written = append(written, s.String())
		}
	}
	return written, kept, specs, nil
}

// exportWindow writes one window's model, and returns its weight spec,
// unless the manifest shows the same inputs produced the file that is there.
func (e *exporter) exportWindow(s window.Span, m *window.Manifest, mu *sync.Mutex) (window.Entry, *weights.Spec, bool, error) {
	if err := e.ctx.Err(); err != nil {
		return window.Entry{}, nil, false, err
	}
	inputs, err := e.windowInputs(s)
	if err != nil {
		return window.Entry{}, nil, false, err
	}
	mu.Lock()
	unchanged := m.Unchanged(e.out.Path(), s, inputs)
	mu.Unlock()
	if unchanged {
		return window.Entry{}, nil, true, nil
	}
	a, err := e.assemble(s, windowDataFile(s))
	if err != nil {
		return window.Entry{}, nil, false, err
	}
	spec := e.spec(a.table)
	model, err := buildModel(a.b, spec, e.plugin, e.opts.Version, &s)
	if err != nil {
		return window.Entry{}, nil, false, err
	}
	data, err := encode(model)
	if err != nil {
		return window.Entry{}, nil, false, err
	}
	entry := window.Entry{Span: s.String(), First: s.First, Last: s.Last, File: s.File(), Inputs: inputs, Output: window.Hash(data)}
	if a.table.Materializing() {
		if err := e.out.materialize(e.ctx, a.table); err != nil {
			return window.Entry{}, nil, false, err
		}
		entry.Files = map[string]string{}
		for _, f := range a.table.DataFiles() {
			sum, err := window.HashFile(e.out.path(f))
			if err != nil {
				return window.Entry{}, nil, false, err
			}
			entry.Files[f] = sum
		}
	}
	if err := e.out.WriteFile(s.File(), data); err != nil {
		return window.Entry{}, nil, false, err
	}
	return entry, spec, false, nil
}

// windowKey is everything a window's bytes depend on.
type windowKey struct {
	Strata, Plugin, PluginVersion string
	ComputeDType, Link, Weights   string
	Subfunctions, CB, CCL         bool
	PluginOptions                 map[string]string
	Checkpoint, ConfigSHA256      string
	Span                          string
	Layers                        int32
	Tensors                       []tensorKey
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
	for _, key := range keys {
		t, ok := e.ckpt.Tensor(key)
		if !ok {
			return "", fmt.Errorf("tensor %s is bound by the plugin but missing from the checkpoint", key)
		}
		shard, _ := e.ckpt.Shard(t.Shard)
		k.Tensors = append(k.Tensors, tensorKey{t.Key, t.Shard, t.DType, t.Shape, t.Offset, t.Length, shard.Size})
	}
	return window.HashJSON(k)
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
		bindings, _ := layerBindings(p.resp, p.layer)
		for _, b := range bindings {
			expr, err := weights.BindingExpr(b)
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

// stitch reads the window files back, one at a time, and joins them;
// specs[i], when set, is window i's spec as built.
func (e *exporter) stitch(spans []window.Span, specs []*weights.Spec) (*onnxpb.ModelProto, *weights.Spec, error) {
	io, err := window.ModelIO{Plan: e.parts.plan, Compute: e.compute,
		Serving: window.Serving{ContinuousBatching: e.opts.ContinuousBatching, CCL: e.opts.CCL}}.Of(window.Whole(int(spans[0].Count)))
	if err != nil {
		return nil, nil, err
	}
	st := window.NewStitcher(io)
	for i, s := range spans {
		if err := e.ctx.Err(); err != nil {
			return nil, nil, err
		}
		data, err := e.out.ReadFile(s.File())
		if err != nil {
			return nil, nil, err
		}
		m := &onnxpb.ModelProto{}
		if err := proto.Unmarshal(data, m); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", e.out.path(s.File()), err)
		}
		if err := st.Add(window.Model{Span: s, Proto: m, Spec: specs[i]}); err != nil {
			return nil, nil, fmt.Errorf("stitching windows: %w", err)
		}
	}
	stitched, spec, err := st.Finish()
	if err != nil {
		return nil, nil, fmt.Errorf("stitching windows: %w", err)
	}
	return stitched, spec, nil
}

// finishWindows makes kept windows runnable (their checkpoint links) or
// removes them, and records the finished model in the manifest.
func (e *exporter) finishWindows(m *window.Manifest, spec *weights.Spec) error {
	if e.opts.KeepWindows {
		if err := e.out.linkWindowShards(e.ckpt, spec); err != nil {
			return err
		}
	} else {
		if err := e.out.RemoveAll(window.Dir); err != nil {
			return err
		}
		m.Windows = nil
	}
	sum, err := window.HashFile(e.out.path(ModelFile))
	if err != nil {
		return err
	}
	m.Model = &window.Output{File: ModelFile, SHA256: sum}
	return m.Save(e.out)
}

// linkWindowShards gives windows/ the same checkpoint/ links as the model,
// so each window file runs on its own: hard links to the output's own
// links (same filesystem by construction), or symlinks to the source.
func (o outDir) linkWindowShards(ckpt *checkpoint.Checkpoint, spec *weights.Spec) error {
	for _, f := range spec.Files {
		src, mode := filepath.Join(o.Abs(), filepath.FromSlash(f.Path)), weights.LinkHard
		if f.Link == weights.LinkSymlink {
			sh, ok := ckpt.Shard(f.Source)
			if !ok {
				return fmt.Errorf("the spec names shard %s, which the checkpoint does not have", f.Source)
			}
			src, mode = sh.Path, weights.LinkSymlink
		}
		dst := window.Dir + "/" + f.Path
		if err := weights.LinkShard(context.Background(), o.Dir, src, dst, mode, nil); err != nil {
			return fmt.Errorf("linking shard %s for the windows: %w", f.Source, err)
		}
	}
	return nil
}
