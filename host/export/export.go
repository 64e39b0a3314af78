// Package export turns a checkpoint into an ONNX model with an architecture
// plugin: check, plan, build the parts, assemble them over initializers that
// reference the checkpoint's bytes, and write model.onnx and
// weight_spec.json atomically.
package export

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"maps"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/quant"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/host/weights/transform"
	"github.com/strata-llm/strata/host/window"
	"github.com/strata-llm/strata/internal/usage"
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// File names in the output directory.
const (
	ModelFile = "model.onnx"
	SpecFile  = "weight_spec.json"
	// WeightsDir holds materialised weights: WholeDataFile for a whole
	// export, one file per window (windowDataFile) for a layerwise one.
	WeightsDir    = "weights"
	WholeDataFile = WeightsDir + "/model.safetensors"
)

func windowDataFile(s window.Span) string {
	return fmt.Sprintf("%s/window_%d_%d.safetensors", WeightsDir, s.First, s.Last)
}

// Options of an export.
type Options struct {
	Out          string // output directory
	ComputeDType string // float32 (default) or float16
	Link         string // how shards are reached: hardlink (default), copy, symlink
	Version      string // strata's version, recorded in the outputs
	// CheckpointName identifies the source in the weight spec, never by a
	// path of the machine (default: the checkpoint directory's name).
	CheckpointName string
	Subfunctions   bool   // each decoder layer a call of a local function, one per layer kind
	Weights        string // reference (default) or materialize
	WeightSpec     string // also write another spec format: "qaic" (version 5, materialised weights only)

	PluginOptions      map[string]string // options only some plugins know (moe_strategy)
	ContinuousBatching bool              // batch_index input, CtxScatterCB/CtxGatherCB, cache of full_batch_size rows
	CCL                bool              // comp_ctx_lengths input: attention reads its length of cache rows

	// Target is the graph's form: TargetQAIC (or "", the default) or
	// TargetORT (ONNX Runtime's, for a plugin declaring it; ort.go).
	Target string
	// Logits are the rows of logits: sdk.LogitsAll (every position: the
	// ORT form's default) or sdk.LogitsLast (each row's last valid token:
	// the QAIC form's only one); "" the target's own.
	Logits string

	// Models are separate models to export beside model.onnx (names the
	// plugin declares in its capabilities), each as <name>.onnx.
	Models []string

	Layerwise   bool // export windows of WindowSize layers, then stitch them
	WindowSize  int  // layers per window (default 1)
	KeepWindows bool // keep windows/ after stitching
	// Overwrite replaces strata's own files in Out even if they changed
	// since (outdir.Options.Overwrite); nothing else.
	Overwrite bool
	Jobs      int // windows exported at once (default: the number of CPUs)

	// DryRun builds the model in memory and reports what would be written
	// (Result.Planned) without opening Out.
	DryRun bool

	// ShardBytes bounds each materialised data file (0: 5 GB), as
	// save_pretrained's max_shard_size.
	ShardBytes int64
	// Progress receives progress of the long phases (copying shards,
	// materialising weights); nil: none. TTY draws a bar in place.
	Progress io.Writer
	TTY      bool
}

// Result describes a finished export.
type Result struct {
	ModelPath, SpecPath string
	ModelBytes          int
	Plan                *pb.PlanResponse
	Spec                *weights.Spec
	Parameters          int64 // elements of all graph weights
	// Layerwise only: windows written, and kept from an earlier run.
	WindowsWritten, WindowsKept []string
	// Notes are things the user should know that did not stop the export.
	Notes []string
	// SeparateModels are the paths and sizes of the separate models written.
	SeparateModels []SeparateFile
	// Planned is what a DryRun would write; nothing was.
	Planned *Planned
}

// SeparateFile is one separate model written beside model.onnx.
type SeparateFile struct {
	Path  string
	Bytes int
}

// exporter carries one export's inputs.
type exporter struct {
	ctx     context.Context
	plugin  *plugins.Plugin
	ckpt    *checkpoint.Checkpoint
	quant   *quant.View // ckpt's quantised weights
	model   *pb.Model   // the plugin's view of ckpt, one object: sent once
	opts    Options
	compute dtype.DType
	parts   parts
	out     outDir
	// separate are the separate models built, committed with model.onnx.
	separate []separateModel
	// notes are the host's own things to tell the user, with the plugin's.
	notes []string
	// ortFiles are genai_config.json and the tokenizer files (--target ort).
	ortFiles map[string][]byte
	// spill takes the encoded initializers of the model being written
	// (whole, or stitched) off the heap: a scratch file in the output.
	spill *graph.Spill
	// modelSum, when set, is given model.onnx's bytes as they are written
	// (the layerwise manifest records their hash).
	modelSum hash.Hash
}

// Run exports ckpt with plugin p. Options and the plugin's answers are
// checked before anything is written; then the model (or each window) is
// built in memory, the shards are linked, the spec written, and model.onnx
// renamed into place last, so a model.onnx present is always complete.
func Run(ctx context.Context, p *plugins.Plugin, ckpt *checkpoint.Checkpoint, opts Options) (res *Result, err error) {
	e := &exporter{ctx: ctx, plugin: p, ckpt: ckpt}
	if e.opts, e.compute, err = checkOptions(opts); err != nil {
		return nil, err
	}
	if e.quant, err = quant.Read(ckpt); err != nil {
		return nil, err
	}
	e.model = Model(ckpt, e.quant)
	exportOpts := &pb.ExportOptions{ComputeDtype: dtype.Name(e.compute), ContinuousBatching: e.opts.ContinuousBatching,
		Ccl: e.opts.CCL, PluginOptions: e.opts.PluginOptions, Target: e.opts.Target, Logits: e.opts.Logits}
	if err := targetGuard(p, ckpt.ModelType, e.opts.Target); err != nil {
		return nil, err
	}
	if e.parts, err = buildParts(ctx, p, ckpt, e.quant, e.model, exportOpts, e.opts.Layerwise, e.opts.WindowSize); err != nil {
		return nil, err
	}
	if e.separate, err = e.buildSeparateModels(exportOpts); err != nil {
		return nil, err
	}
	if e.opts.Target == TargetORT {
		if e.ortFiles, err = ortFiles(ckpt, e.parts.plan); err != nil {
			return nil, err
		}
	}
	e.model = nil // the plugin has built everything: the inventory can go
	if e.opts.DryRun {
		return e.dryRun()
	}
	if e.out, err = prepareOut(ctx, e.opts.Out, ckpt, e.opts); err != nil {
		return nil, err
	}
	if e.opts.Link == weights.LinkAuto && len(ckpt.Shards) > 0 {
		var reason string
		e.opts.Link, reason = weights.ResolveAuto(e.out.Dir, ckpt.Shards[0].Path)
		// Materialised, the model reads weights/ (one link per file) and
		// checkpoint/ is provenance: the onnx package loads the export, and
		// --link copy would only duplicate the checkpoint. Nothing to say.
		if reason != "" && !(e.opts.Weights == weights.Materialize && e.opts.Link == weights.LinkHard) {
			e.notes = append(e.notes, reason)
		}
		for _, m := range e.separate { // built before the directory was there to probe
			for i := range m.spec.Files {
				if m.spec.Files[i].Link == weights.LinkAuto {
					m.spec.Files[i].Link = e.opts.Link
				}
			}
		}
	}
	e.spill = graph.NewSpill(e.out.Scratch)
	defer e.spill.Close()
	defer func() {
		if err != nil {
			err = e.out.discard(e.out.withRemedy(err), e.opts.KeepWindows)
		} else {
			err = e.out.Close()
		}
	}()
	if e.opts.Layerwise {
		return e.layerwise()
	}
	return e.whole()
}

func checkOptions(opts Options) (Options, dtype.DType, error) {
	compute, err := dtype.ParseCompute(opts.ComputeDType)
	if err != nil {
		return opts, 0, usage.Errorf("%v", err)
	}
	if opts.Link == "" {
		opts.Link = weights.LinkAuto
	}
	if !slices.Contains(weights.LinkModes, opts.Link) {
		return opts, 0, usage.Errorf("unknown --link %q: use one of %s", opts.Link, strings.Join(weights.LinkModes, ", "))
	}
	if opts.Weights == "" {
		opts.Weights = weights.Reference
	}
	if !slices.Contains(weights.Modes, opts.Weights) {
		return opts, 0, usage.Errorf("unknown --weights %q: use one of %s", opts.Weights, strings.Join(weights.Modes, ", "))
	}
	switch {
	case opts.WeightSpec != "" && opts.WeightSpec != weights.QAICSpec:
		return opts, 0, usage.Errorf("unknown --weight-spec %q: strata's own spec is always written; the other format is %q", opts.WeightSpec, weights.QAICSpec)
	case opts.WeightSpec == weights.QAICSpec && opts.Weights != weights.Materialize:
		return opts, 0, usage.Errorf("--weight-spec qaic needs --weights materialize: the version-5 format maps each weight to a safetensors key and has no transforms")
	}
	if opts.WindowSize == 0 {
		opts.WindowSize = 1
	}
	if opts.WindowSize < 0 || opts.Layerwise && opts.WindowSize < 1 {
		return opts, 0, usage.Errorf("--window-size must be at least 1, got %d", opts.WindowSize)
	}
	if opts.Jobs == 0 {
		opts.Jobs = runtime.NumCPU()
	}
	if opts.Jobs < 0 {
		return opts, 0, usage.Errorf("-j must be at least 1, got %d", opts.Jobs)
	}
	if opts.Target, err = checkTarget(opts); err != nil {
		return opts, 0, err
	}
	if opts.Logits, err = checkLogits(opts.Logits, opts.Target); err != nil {
		return opts, 0, err
	}
	return opts, compute, nil
}

// LayerwiseError says the architecture cannot be exported layerwise.
type LayerwiseError struct {
	ModelType, Plugin string
	Reasons           []string
}

func (e *LayerwiseError) Error() string {
	return fmt.Sprintf("--layerwise: plugin %s does not support layerwise export of %s: %s",
		e.Plugin, e.ModelType, strings.Join(e.Reasons, "; "))
}

// layerwiseGuard refuses --layerwise where the plugin declares it
// unsupported, for the architecture or for this checkpoint.
func layerwiseGuard(p *plugins.Plugin, modelType string, check *pb.CheckResponse) error {
	support, _ := p.Support(modelType)
	if caps := support.GetCapabilities(); !caps.GetLayerwise() {
		why := caps.GetLayerwiseReason()
		if why == "" {
			why = "the plugin does not declare layerwise support"
		}
		return &LayerwiseError{ModelType: modelType, Plugin: p.Desc.GetName(), Reasons: []string{why}}
	}
	if !check.GetLayerwiseSupported() {
		return &LayerwiseError{ModelType: modelType, Plugin: p.Desc.GetName(), Reasons: check.GetReasons()}
	}
	return nil
}

// whole exports the model as one graph.
func (e *exporter) whole() (*Result, error) {
	a, spec, m, held, err := e.buildWhole()
	if err != nil {
		return nil, err
	}
	n, err := e.commit(m, held, spec, a.table)
	if err != nil {
		return nil, err
	}
	return e.result(spec, n), nil
}

// buildWhole assembles and builds the whole model in memory, with its spec.
// A dry run has no output directory, and no spill (nil).
func (e *exporter) buildWhole() (*assembler, *weights.Spec, *onnxpb.ModelProto, graph.Held, error) {
	a, err := e.assemble(window.Whole(len(e.parts.plan.GetLayers())), WholeDataFile, e.spill)
	if err != nil {
		return nil, nil, nil, graph.Held{}, err
	}
	e.releaseParts()
	a.table.Placed()
	spec := e.spec(a.table)
	m, held, err := buildModel(a.b, nil, e.plugin, e.opts.Version, nil)
	if err != nil {
		return nil, nil, nil, graph.Held{}, err
	}
	return a, spec, m, held, nil
}

// releaseParts lets go of the plugin's parts (but the plan) once they are
// in the graph: 12 MB of GLM-4.6's heap, which the model's encoding and
// stitching then need.
func (e *exporter) releaseParts() {
	e.parts = parts{plan: e.parts.plan}
	e.quant = nil // every binding is resolved
}

// commit encodes and writes the finished model (and, materialising, the
// whole model's weights; with --weight-spec qaic, that spec) unless the
// export was interrupted. It returns the model's size.
func (e *exporter) commit(m *onnxpb.ModelProto, held graph.Held, spec *weights.Spec, t *weights.Table) (int, error) {
	tables, specs := []*weights.Table{t}, []*weights.Spec{spec} // checked before a previous export is touched
	for _, s := range e.separate {
		tables, specs = append(tables, s.table), append(specs, s.spec)
	}
	need := writes{materialized: materializedBytes(tables...), copied: copiedBytes(e.ckpt, specs...)}
	if err := e.out.room("this export", need); err != nil {
		return 0, err
	}
	extra := map[string][]byte{}
	if e.opts.WeightSpec == weights.QAICSpec {
		qaic, err := weights.QAIC(m, spec, modelName(e.ckpt), e.out.Path())
		if err != nil {
			return 0, err
		}
		extra[weights.QAICSpecFile] = qaic
	}
	maps.Copy(extra, e.ortFiles)
	if err := e.out.pruneORTFiles(e.ortFiles); err != nil {
		return 0, err
	}
	for _, s := range e.separate {
		extra[s.file] = s.data
		if s.table.Materializing() {
			if err := e.out.materialize(e.ctx, s.table); err != nil {
				return 0, err
			}
		}
	}
	all, err := weights.Merge(specs)
	if err != nil {
		return 0, err
	}
	*spec = *all
	// The model's metadata points at weight_spec.json rather than holding
	// it. The spec is streamed to its file (9 MB for GLM-4.6, not held),
	// hashed on the way, and named after the shards are linked.
	specFile, err := e.out.Create(SpecFile)
	if err != nil {
		return 0, err
	}
	defer specFile.Abort() // nothing, once committed
	sum := sha256.New()
	buffered := bufio.NewWriterSize(io.MultiWriter(specFile, sum), 1<<20)
	if _, err := spec.WriteTo(buffered); err != nil {
		return 0, fmt.Errorf("writing %s: %w", e.out.path(SpecFile), err)
	}
	if err := buffered.Flush(); err != nil {
		return 0, fmt.Errorf("writing %s: %w", e.out.path(SpecFile), err)
	}
	ref, err := spec.ReferenceSum(SpecFile, sum.Sum(nil))
	if err != nil {
		return 0, err
	}
	setMetadata(m, weights.MetadataKey, ref)
	setMetadata(m, "strata.model_type", spec.ModelType)
	setMetadata(m, "strata.compute_dtype", spec.ComputeDType)
	if err := e.ctx.Err(); err != nil {
		return 0, err
	}
	return e.out.write(e.ctx, e.ckpt, spec, specFile, m, held, t, extra, e.modelSum)
}

// modelName is the checkpoint's class (config.json architectures[0]).
func modelName(c *checkpoint.Checkpoint) string {
	if len(c.Architectures) > 0 {
		return c.Architectures[0]
	}
	return c.ModelType
}

// A model built by one builder at a time may spill its initializers (nil:
// held in memory).
func (e *exporter) assemble(s window.Span, dataPath string, spill *graph.Spill) (*assembler, error) {
	a := newAssembler(e.parts, e.ckpt, e.quant, e.compute, s, e.opts.Subfunctions,
		window.Serving{ContinuousBatching: e.opts.ContinuousBatching, CCL: e.opts.CCL}, e.opts.Weights, dataPath)
	a.ort = e.opts.Target == TargetORT
	if spill != nil {
		a.b.SpillTo(spill)
	}
	err := a.run()
	if err == nil {
		a.table.ShardBytes = e.opts.ShardBytes
		err = a.table.Layout()
	}
	if err != nil {
		return nil, fmt.Errorf("assembling layers %s from plugin %s: %w", s, e.plugin.Desc.GetName(), err)
	}
	return a, nil
}

func (e *exporter) spec(t *weights.Table) *weights.Spec {
	spec := &weights.Spec{
		Format: weights.SpecFormat, Version: weights.SpecVersion,
		Producer:  weights.Producer{Strata: e.opts.Version, Plugin: e.plugin.Desc.GetName(), PluginVersion: e.plugin.Desc.GetVersion()},
		ModelType: e.ckpt.ModelType, ComputeDType: dtype.Name(e.compute), Mode: e.opts.Weights, Checkpoint: e.checkpointName(),
		Files: t.Files, Weights: t.Weights(),
	}
	for i := range spec.Files {
		if spec.Files[i].Kind == weights.KindCheckpoint {
			spec.Files[i].Link = e.opts.Link
		}
	}
	return spec
}

// checkpointName is the spec's identity of the source: a name, not a path.
func (e *exporter) checkpointName() string {
	if e.opts.CheckpointName != "" {
		return e.opts.CheckpointName
	}
	return filepath.Base(e.ckpt.Dir)
}

func (e *exporter) result(spec *weights.Spec, modelBytes int) *Result {
	res := &Result{
		ModelPath: e.out.path(ModelFile), SpecPath: e.out.path(SpecFile), ModelBytes: modelBytes,
		Plan: e.parts.plan, Spec: spec, Parameters: parameters(spec),
	}
	for _, s := range e.separate {
		res.SeparateModels = append(res.SeparateModels, SeparateFile{Path: e.out.path(s.file), Bytes: len(s.data)})
	}
	if n := mtpLeftOut(e.parts.plan.GetMtp(), spec); n != "" {
		res.Notes = append(res.Notes, n)
	}
	if e.opts.Target == TargetORT && spec.Mode == weights.Reference {
		if n := ortComputedNote(spec); n != "" {
			res.Notes = append(res.Notes, n)
		}
	}
	res.Notes = append(res.Notes, e.notes...)
	return res
}

// mtpLeftOut says so when the plan reports multi-token-prediction weights
// and the export binds none of them.
func mtpLeftOut(m *pb.MTPLayout, spec *weights.Spec) string {
	if len(m.GetKeys()) == 0 {
		return ""
	}
	keys := map[string]bool{}
	for _, k := range m.GetKeys() {
		keys[k] = true
	}
	for _, w := range spec.Weights {
		for _, src := range w.Sources {
			if keys[src.Key] {
				return ""
			}
		}
	}
	where := m.GetConvention()
	if len(m.GetLayers()) > 0 {
		where += fmt.Sprintf(", layers %v", m.GetLayers())
	}
	return fmt.Sprintf("the checkpoint's MTP weights (%s, %d tensors) are left out of this export", where, len(m.GetKeys()))
}

// Model is the plugin's view of ckpt: every tensor's key, dtype and shape,
// a quantised weight as one float32 tensor (q.Inventory).
func Model(ckpt *checkpoint.Checkpoint, q *quant.View) *pb.Model {
	return &pb.Model{ConfigJson: ckpt.ConfigJSON, Tensors: q.Inventory(ckpt)}
}

// buildParts asks the plugin whether it can export the model (and, with
// layerwise, whether it can do that layerwise, in windows of windowSize
// layers), then for the plan and parts, each validated as it arrives.
func buildParts(ctx context.Context, p *plugins.Plugin, ckpt *checkpoint.Checkpoint, q *quant.View, model *pb.Model, opts *pb.ExportOptions, layerwise bool, windowSize int) (parts, error) {
	check, err := p.Check(ctx, model)
	if err != nil {
		return parts{}, err
	}
	if !check.GetSupported() {
		return parts{}, fmt.Errorf("plugin %s cannot export this checkpoint: %s", p.Desc.GetName(), strings.Join(check.GetReasons(), "; "))
	}
	if p.Holds(model) {
		// Later calls send the model's id alone: its inventory can go
		// (10 MB of Kimi-K2's heap, which every garbage collection of the
		// export scanned).
		model.Tensors = nil
	}
	if layerwise {
		if err := layerwiseGuard(p, ckpt.ModelType, check); err != nil {
			return parts{}, err
		}
	}
	plan, err := p.Plan(ctx, &pb.PlanRequest{Model: model, Options: opts})
	if err != nil {
		return parts{}, err
	}
	if err := validatePlan(plan); err != nil {
		return parts{}, fmt.Errorf("plugin %s returned an invalid plan: %w", p.Path, err)
	}
	if err := lastLogitsGuard(p, plan, opts.GetLogits()); err != nil {
		return parts{}, err
	}
	ps := parts{plan: plan, kinds: map[string]*pb.BuildResponse{}}
	c := contracts{plan: plan, serving: window.Serving{ContinuousBatching: opts.GetContinuousBatching(), CCL: opts.GetCcl()},
		ort: opts.GetTarget() == sdk.TargetORT}
	if layerwise {
		c.windowSize = windowSize
	}
	build := func(part, kind string, layers []int32) (*pb.BuildResponse, error) {
		resp, err := p.Build(ctx, &pb.BuildRequest{Model: model, Options: opts, Part: part, Kind: kind, Layers: layers})
		if err == nil && resp.GetFunction() == nil {
			err = fmt.Errorf("plugin %s: Build %s returned no function", p.Path, part)
		}
		if err == nil {
			err = c.of(part, kind).check(p.Desc.GetName(), resp)
		}
		if err == nil {
			err = quantizeActivations(resp, q)
		}
		return resp, err
	}
	if !plan.GetInputsEmbeds() {
		if ps.embed, err = build(sdk.PartEmbed, "", nil); err != nil {
			return parts{}, err
		}
	}
	if ps.context, err = build(sdk.PartContext, "", nil); err != nil {
		return parts{}, err
	}
	for _, kind := range plan.GetKinds() {
		if ps.kinds[kind.GetName()], err = build(sdk.PartLayer, kind.GetName(), layersOf(plan, kind.GetName())); err != nil {
			return parts{}, err
		}
	}
	if ps.final, err = build(sdk.PartFinal, "", nil); err != nil {
		return parts{}, err
	}
	return ps, nil
}

// validatePlan checks what the assembler relies on: layers 0..N-1 in order,
// each of a declared kind with at least one cache.
func validatePlan(plan *pb.PlanResponse) error {
	if len(plan.GetLayers()) == 0 {
		return fmt.Errorf("no decoder layers")
	}
	kinds := kindIndex(plan)
	for i, l := range plan.GetLayers() {
		if l.GetIndex() != int32(i) {
			return fmt.Errorf("layer %d is listed at position %d", l.GetIndex(), i)
		}
		k, ok := kinds[l.GetKind()]
		if !ok {
			return fmt.Errorf("layer %d has undeclared kind %q", i, l.GetKind())
		}
		if len(k.GetCaches()) == 0 {
			return fmt.Errorf("layer kind %q has no cache", k.GetName())
		}
	}
	if plan.GetVocabSize() <= 0 {
		return fmt.Errorf("vocab_size %d", plan.GetVocabSize())
	}
	return nil
}

func kindIndex(plan *pb.PlanResponse) map[string]*pb.LayerKind {
	m := map[string]*pb.LayerKind{}
	for _, k := range plan.GetKinds() {
		m[k.GetName()] = k
	}
	return m
}

func layersOf(plan *pb.PlanResponse, kind string) []int32 {
	var out []int32
	for _, l := range plan.GetLayers() {
		if l.GetKind() == kind {
			out = append(out, l.GetIndex())
		}
	}
	return out
}

// buildModel finishes the model with its provenance and the weight spec in
// the metadata; a window's span is recorded too (nil for a whole model).
// Its checkpoint tensors' initializers are apart (graph.Builder.ModelHeld).
func buildModel(b *graph.Builder, spec *weights.Spec, p *plugins.Plugin, version string, span *window.Span) (*onnxpb.ModelProto, graph.Held, error) {
	props := map[string]string{
		"strata.version":        version,
		"strata.plugin":         p.Desc.GetName(),
		"strata.plugin_version": p.Desc.GetVersion(),
	}
	if spec != nil { // else commit records a reference to weight_spec.json
		compact, err := spec.Compact()
		if err != nil {
			return nil, graph.Held{}, err
		}
		props["strata.model_type"], props["strata.compute_dtype"], props[weights.MetadataKey] = spec.ModelType, spec.ComputeDType, compact
	}
	if span != nil {
		props[window.MetadataKey] = span.String()
	}
	m, held := b.ModelHeld(graph.Metadata{ProducerName: "strata", ProducerVersion: version, Props: props})
	return m, held, nil
}

// setMetadata sets (or adds) a metadata entry of m.
func setMetadata(m *onnxpb.ModelProto, key, value string) {
	for _, p := range m.GetMetadataProps() {
		if p.GetKey() == key {
			p.Value = value
			return
		}
	}
	m.MetadataProps = append(m.MetadataProps, &onnxpb.StringStringEntryProto{Key: key, Value: value})
	// Sorted as graph.Builder writes them: the same model, the same bytes,
	// whole or stitched.
	slices.SortFunc(m.MetadataProps, func(a, b *onnxpb.StringStringEntryProto) int { return strings.Compare(a.GetKey(), b.GetKey()) })
}

// encode marshals a model deterministically: the same model, the same bytes.
func encode(m *onnxpb.ModelProto) ([]byte, error) {
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding the model: %w", err)
	}
	return data, nil
}

// parameters counts the elements of every checkpoint tensor the graph
// reads (each source records its tensor's shape).
func parameters(spec *weights.Spec) int64 {
	sources := 0
	for _, w := range spec.Weights {
		sources += len(w.Sources)
	}
	seen := make(map[string]bool, sources) // sized once: Kimi-K2 reads 139,000
	var n int64
	for _, w := range spec.Weights {
		for _, s := range w.Sources {
			if !seen[s.Key] {
				seen[s.Key] = true
				n += transform.Type{Shape: s.Shape}.Elements()
			}
		}
	}
	return n
}
