// Package export turns a checkpoint into an ONNX model with an architecture
// plugin: check, plan, build the parts, assemble them over initializers that
// reference the checkpoint's bytes, and write model.onnx and
// weight_spec.json atomically.
package export

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/dtype"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// File names in the output directory.
const (
	ModelFile = "model.onnx"
	SpecFile  = "weight_spec.json"
)

// Options of an export.
type Options struct {
	Out          string // output directory
	ComputeDType string // float32 (default) or float16
	Link         string // how shards are reached: hardlink (default), copy, symlink
	Version      string // strata's version, recorded in the outputs
}

// Result describes a finished export.
type Result struct {
	ModelPath, SpecPath string
	ModelBytes          int
	Plan                *pb.PlanResponse
	Spec                *weights.Spec
	Parameters          int64 // elements of all graph weights
}

// Run exports ckpt with plugin p. Nothing is written until the whole model
// has been built in memory; then the shards are linked, the spec written,
// and model.onnx renamed into place last, so a model.onnx present is always
// complete.
func Run(ctx context.Context, p *plugins.Plugin, ckpt *checkpoint.Checkpoint, opts Options) (res *Result, err error) {
	compute, err := dtype.ParseCompute(opts.ComputeDType)
	if err != nil {
		return nil, err
	}
	if opts.Link == "" {
		opts.Link = weights.LinkHard
	}
	if !slices.Contains(weights.LinkModes, opts.Link) {
		return nil, fmt.Errorf("unknown --link %q: use one of %s", opts.Link, strings.Join(weights.LinkModes, ", "))
	}
	out, err := prepareOut(opts.Out)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			out.discard()
		}
	}()
	ps, err := buildParts(ctx, p, Model(ckpt), &pb.ExportOptions{ComputeDtype: dtype.Name(compute)})
	if err != nil {
		return nil, err
	}
	b := graph.New(ps.plan.GetModelType())
	a := &assembler{parts: ps, compute: compute, b: b, table: weights.NewTable(ckpt, compute, b), kinds: kindIndex(ps.plan)}
	if err := a.run(); err != nil {
		return nil, fmt.Errorf("assembling the model from plugin %s: %w", p.Desc.GetName(), err)
	}
	spec := &weights.Spec{
		Format: weights.SpecFormat, Version: weights.SpecVersion,
		Producer:  weights.Producer{Strata: opts.Version, Plugin: p.Desc.GetName(), PluginVersion: p.Desc.GetVersion()},
		ModelType: ckpt.ModelType, ComputeDType: dtype.Name(compute), Checkpoint: ckpt.Dir,
		Files: a.table.Files, Weights: a.table.Weights(),
	}
	for i := range spec.Files {
		spec.Files[i].Link = opts.Link
	}
	modelBytes, err := encodeModel(b, spec, p, opts.Version)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := out.write(ckpt, spec, modelBytes); err != nil {
		return nil, err
	}
	return &Result{
		ModelPath: out.path(ModelFile), SpecPath: out.path(SpecFile), ModelBytes: len(modelBytes),
		Plan: ps.plan, Spec: spec, Parameters: parameters(ckpt, spec),
	}, nil
}

// Inventory lists every tensor's key, dtype and shape for the plugin.
func inventory(ckpt *checkpoint.Checkpoint) []*pb.TensorInfo {
	keys := ckpt.Keys()
	out := make([]*pb.TensorInfo, len(keys))
	for i, k := range keys {
		t, _ := ckpt.Tensor(k)
		out[i] = &pb.TensorInfo{Key: k, Dtype: t.DType, Shape: t.Shape}
	}
	return out
}

// Model is the plugin's view of ckpt.
func Model(ckpt *checkpoint.Checkpoint) *pb.Model {
	return &pb.Model{ConfigJson: ckpt.ConfigJSON, Tensors: inventory(ckpt)}
}

func buildParts(ctx context.Context, p *plugins.Plugin, model *pb.Model, opts *pb.ExportOptions) (parts, error) {
	check, err := p.Check(ctx, model)
	if err != nil {
		return parts{}, err
	}
	if !check.GetSupported() {
		return parts{}, fmt.Errorf("plugin %s cannot export this checkpoint: %s", p.Desc.GetName(), strings.Join(check.GetReasons(), "; "))
	}
	plan, err := p.Plan(ctx, &pb.PlanRequest{Model: model, Options: opts})
	if err != nil {
		return parts{}, err
	}
	if err := validatePlan(plan); err != nil {
		return parts{}, fmt.Errorf("plugin %s returned an invalid plan: %w", p.Path, err)
	}
	ps := parts{plan: plan, kinds: map[string]*pb.BuildResponse{}}
	build := func(part, kind string, layers []int32) (*pb.BuildResponse, error) {
		resp, err := p.Build(ctx, &pb.BuildRequest{Model: model, Options: opts, Part: part, Kind: kind, Layers: layers})
		if err == nil && resp.GetFunction() == nil {
			err = fmt.Errorf("plugin %s: Build %s returned no function", p.Path, part)
		}
		return resp, err
	}
	if ps.embed, err = build(sdk.PartEmbed, "", nil); err != nil {
		return parts{}, err
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

// encodeModel finishes the model with its provenance and the weight spec in
// the metadata, and encodes it deterministically.
func encodeModel(b *graph.Builder, spec *weights.Spec, p *plugins.Plugin, version string) ([]byte, error) {
	compact, err := spec.Compact()
	if err != nil {
		return nil, err
	}
	m := b.Model(graph.Metadata{
		ProducerName: "strata", ProducerVersion: version,
		Props: map[string]string{
			"strata.version":        version,
			"strata.plugin":         p.Desc.GetName(),
			"strata.plugin_version": p.Desc.GetVersion(),
			"strata.model_type":     spec.ModelType,
			"strata.compute_dtype":  spec.ComputeDType,
			weights.MetadataKey:     compact,
		},
	})
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding the model: %w", err)
	}
	return data, nil
}

func parameters(ckpt *checkpoint.Checkpoint, spec *weights.Spec) int64 {
	seen := map[string]bool{}
	var n int64
	for _, w := range spec.Weights {
		if !seen[w.Key] {
			seen[w.Key] = true
			t, _ := ckpt.Tensor(w.Key)
			n += t.Elements()
		}
	}
	return n
}
