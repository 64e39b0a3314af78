package export

import (
	"crypto/sha256"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/host/progress"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/host/window"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Planned is what an export would write (Options.DryRun): the model is
// built in memory as a real run builds it, and nothing is written.
type Planned struct {
	// Files in Out, with the sizes a real run writes (materialised data:
	// its tensor bytes; the safetensors headers add a few kB).
	Files []PlannedFile
	// Inputs and Outputs are model.onnx's.
	Inputs, Outputs []PlannedIO
	// Windows are the layer spans of a layerwise export ("0-3"); Sizes
	// are then the whole graph's, which the stitched one matches within
	// a few bytes of names.
	Windows []string
	// Link is how checkpoint/ would reach the shards; with auto it is
	// decided on the output's file system when writing (sizes assume
	// hardlink: reflink is a byte shorter per checkpoint file).
	Link string
}

// PlannedFile is one file an export would write.
type PlannedFile struct {
	Path  string // relative to Out
	Bytes int64  // -1: known when written (windows, their manifest)
	What  string // model, weight_spec, weights, checkpoint, window
}

// PlannedIO is a graph input or output: dims are numbers or names.
type PlannedIO struct {
	Name  string
	DType string
	Shape []string
}

// dryRun builds the whole model as whole() does and reports its files,
// sizes and interface without opening Out.
func (e *exporter) dryRun() (*Result, error) {
	link := e.opts.Link
	if link == weights.LinkAuto {
		e.opts.Link = weights.LinkHard
	}
	planned := &Planned{Link: link}
	if e.opts.Layerwise {
		spans, err := window.Cut(len(e.parts.plan.GetLayers()), e.opts.WindowSize)
		if err != nil {
			return nil, err
		}
		for _, s := range spans {
			planned.Windows = append(planned.Windows, s.String())
			if e.opts.KeepWindows {
				planned.Files = append(planned.Files, PlannedFile{Path: s.File(), Bytes: -1, What: "window"})
			}
		}
		if e.writesWindows() {
			planned.Files = append(planned.Files, PlannedFile{Path: window.ManifestFile, Bytes: -1, What: "manifest"})
		}
	}
	a, spec, m, held, err := e.buildWhole()
	if err != nil {
		return nil, err
	}
	var qaic []byte
	if e.opts.WeightSpec == weights.QAICSpec { // before the model's size: it turns weights into inputs
		if qaic, err = weights.QAIC(m, spec, modelName(e.ckpt), e.opts.Out); err != nil {
			return nil, err
		}
	}
	specs := []*weights.Spec{spec}
	for _, s := range e.separate {
		for i := range s.spec.Files { // as Run resolves auto for them
			if s.spec.Files[i].Link == weights.LinkAuto {
				s.spec.Files[i].Link = e.opts.Link
			}
		}
		specs = append(specs, s.spec)
		planned.Files = append(planned.Files, PlannedFile{Path: s.file, Bytes: int64(len(s.data)), What: "model"})
	}
	if spec, err = weights.Merge(specs); err != nil {
		return nil, err
	}
	// The spec's bytes and hash, then the model with the metadata that
	// names them, as commit writes both.
	var specSize counter
	sum := sha256.New()
	if _, err := spec.WriteTo(io.MultiWriter(&specSize, sum)); err != nil {
		return nil, err
	}
	ref, err := spec.ReferenceSum(SpecFile, sum.Sum(nil))
	if err != nil {
		return nil, err
	}
	setMetadata(m, weights.MetadataKey, ref)
	setMetadata(m, "strata.model_type", spec.ModelType)
	setMetadata(m, "strata.compute_dtype", spec.ComputeDType)
	var modelSize counter
	if _, err := graph.WriteModel(&modelSize, m, held); err != nil {
		return nil, err
	}
	planned.Files = append([]PlannedFile{{Path: ModelFile, Bytes: int64(modelSize), What: "model"}, {Path: SpecFile, Bytes: int64(specSize), What: "weight_spec"}}, planned.Files...)
	if qaic != nil {
		planned.Files = append(planned.Files, PlannedFile{Path: weights.QAICSpecFile, Bytes: int64(len(qaic)), What: "weight_spec"})
	}
	for _, name := range ORTFiles() { // --target ort: genai_config.json, the tokenizer files
		if data, ok := e.ortFiles[name]; ok {
			what := "tokenizer"
			if name == GenAIConfigFile {
				what = "genai_config"
			}
			planned.Files = append(planned.Files, PlannedFile{Path: name, Bytes: int64(len(data)), What: what})
		}
	}
	if a.table.Materializing() {
		planned.Files = append(planned.Files, PlannedFile{Path: WeightsDir + "/", Bytes: a.table.DataBytes(), What: "weights"})
	}
	tables := []*weights.Table{a.table}
	for _, s := range e.separate {
		tables = append(tables, s.table)
	}
	if note := fitNote(e.opts.Out, writes{materialized: materializedBytes(tables...), copied: copiedBytes(e.ckpt, spec)}); note != "" {
		e.notes = append(e.notes, note)
	}
	for _, f := range spec.Files {
		if sh, ok := e.ckpt.Shard(f.Source); ok && f.Kind == weights.KindCheckpoint {
			planned.Files = append(planned.Files, PlannedFile{Path: filepath.ToSlash(f.Path), Bytes: sh.Size, What: "checkpoint"})
		}
	}
	planned.Inputs, planned.Outputs = graphIO(m.GetGraph().GetInput()), graphIO(m.GetGraph().GetOutput())
	res := &Result{Plan: e.parts.plan, Spec: spec, Parameters: parameters(spec), ModelBytes: int(modelSize), Planned: planned}
	res.Notes = append(res.Notes, e.notes...)
	return res, nil
}

func graphIO(values []*onnxpb.ValueInfoProto) []PlannedIO {
	var out []PlannedIO
	for _, v := range values {
		t := v.GetType().GetTensorType()
		io := PlannedIO{Name: v.GetName(), DType: strings.ToLower(onnxpb.TensorProto_DataType_name[t.GetElemType()]), Shape: []string{}}
		for _, d := range t.GetShape().GetDim() {
			if d.GetDimParam() != "" {
				io.Shape = append(io.Shape, d.GetDimParam())
			} else {
				io.Shape = append(io.Shape, strconv.FormatInt(d.GetDimValue(), 10))
			}
		}
		out = append(out, io)
	}
	return out
}

// counter counts the bytes written through it.
type counter int64

func (c *counter) Write(b []byte) (int, error) {
	*c += counter(len(b))
	return len(b), nil
}

// fitNote says when need does not fit in the free space of out's file
// system (a real run's refusal, foretold); "" when it fits or cannot tell.
func fitNote(out string, need writes) string {
	if out == "" || need.total() == 0 {
		return ""
	}
	free, err := outdir.AvailableAt(out)
	if err != nil || need.total() <= free {
		return ""
	}
	return fmt.Sprintf("the %s this export writes do not fit in the %s free on the file system of %s: a real run would refuse",
		need, progress.Bytes(free), out)
}
