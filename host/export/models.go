package export

import (
	"fmt"
	"slices"
	"strings"

	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/host/window"
	"github.com/strata-llm/strata/sdk"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// A separate model is one the plan describes beside model.onnx (a vision
// encoder, an MTP draft): one function from the plugin, its graph inputs
// and outputs as the plan declares them, its weights through the same
// table as the main model's. It is written as <name>.onnx.

// separateModel is one built separate model, ready to commit.
type separateModel struct {
	name  string
	file  string
	data  []byte
	spec  *weights.Spec
	table *weights.Table
}

// ModelFileOf is the file a separate model is written to.
func ModelFileOf(name string) string { return name + ".onnx" }

// buildSeparateModels builds each model the options ask for, after checking
// the plugin declares it (capabilities) and the plan describes it.
func (e *exporter) buildSeparateModels(exportOpts *pb.ExportOptions) ([]separateModel, error) {
	var out []separateModel
	support, _ := e.plugin.Support(e.ckpt.ModelType)
	declared := support.GetCapabilities().GetModels()
	names := slices.Clone(e.opts.Models)
	for _, m := range e.parts.plan.GetModels() {
		// Asked for by the plugin options already (glm's --mtp draft).
		if m.GetByDefault() && slices.Contains(declared, m.GetName()) && !slices.Contains(names, m.GetName()) {
			names = append(names, m.GetName())
		}
	}
	for _, name := range names {
		if !slices.Contains(declared, name) {
			return nil, fmt.Errorf("--extra-model %s: plugin %s builds no model %q for %s (it builds: %s)",
				name, e.plugin.Desc.GetName(), name, e.ckpt.ModelType, listOrNone(declared))
		}
		i := slices.IndexFunc(e.parts.plan.GetModels(), func(m *pb.ModelSpec) bool { return m.GetName() == name })
		if i < 0 {
			return nil, fmt.Errorf("--extra-model %s: plugin %s declares it but its plan does not describe it", name, e.plugin.Desc.GetName())
		}
		m, err := e.buildSeparate(e.parts.plan.GetModels()[i], exportOpts)
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", name, err)
		}
		out = append(out, m)
	}
	return out, nil
}

func (e *exporter) buildSeparate(spec *pb.ModelSpec, exportOpts *pb.ExportOptions) (separateModel, error) {
	name := spec.GetName()
	if name == "" || name == "model" || strings.ContainsAny(name, `/\.`) {
		return separateModel{}, fmt.Errorf("the plugin names a model %q; a model's name must be a plain word other than \"model\"", name)
	}
	resp, err := e.plugin.Build(e.ctx, &pb.BuildRequest{Model: e.model, Options: exportOpts, Part: sdk.PartModel, ModelName: name})
	if err != nil {
		return separateModel{}, err
	}
	if resp.GetFunction() == nil {
		return separateModel{}, fmt.Errorf("plugin %s: Build model %s returned no function", e.plugin.Path, name)
	}
	if err := separateContract(spec).check(e.plugin.Desc.GetName(), resp); err != nil {
		return separateModel{}, err
	}
	if err := quantizeActivations(resp, e.quant); err != nil {
		return separateModel{}, err
	}
	b := graph.New(name)
	table := weights.NewTable(e.ckpt, e.quant, e.compute, b, e.opts.Weights, WeightsDir+"/"+name+".safetensors")
	inputs, err := e.declare(spec.GetInputs(), b.Input)
	if err != nil {
		return separateModel{}, err
	}
	outputs, err := e.declare(spec.GetOutputs(), b.Output)
	if err != nil {
		return separateModel{}, err
	}
	a := &assembler{compute: e.compute, b: b, table: table, read: map[string]bool{}}
	if err := a.place(resp, sdk.NonLayer, name, keepFormal(inputs, resp), outputs); err != nil {
		return separateModel{}, err
	}
	table.ShardBytes = e.opts.ShardBytes
	if err := table.Layout(); err != nil {
		return separateModel{}, err
	}
	ws := e.spec(table)
	m, held, err := buildModel(b, ws, e.plugin, e.opts.Version, nil)
	if err != nil {
		return separateModel{}, err
	}
	if _, err := graph.Hold(m, held); err != nil {
		return separateModel{}, err
	}
	data, err := encode(m)
	if err != nil {
		return separateModel{}, err
	}
	return separateModel{name: name, file: ModelFileOf(name), data: data, spec: ws, table: table}, nil
}

// declare adds each value as a graph input or output (by add) and maps the
// function's formal name to it (the same name).
func (e *exporter) declare(specs []*pb.IOSpec, add func(string, onnxpb.TensorProto_DataType, ...graph.Dim)) (map[string]string, error) {
	names := map[string]string{}
	for _, s := range specs {
		v, err := window.SpecValue(s, e.compute)
		if err != nil {
			return nil, err
		}
		add(v.Name, v.Type, v.Dims...)
		names[v.Name] = v.Name
	}
	return names, nil
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
