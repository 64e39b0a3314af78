package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/export"
	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/quant"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:        "inspect",
		Usage:       "describe a checkpoint: architecture, plugin, layers, parameters, dtypes, shards, and whether strata can export it",
		ArgsUsage:   modelArgs,
		Description: modelHelp,
		Flags:       []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}, revisionFlag()},
		Action: func(c *cli.Context) error {
			model, err := oneArg(c, modelArgs)
			if err != nil {
				return err
			}
			loc, err := locateModel(c, model)
			if err != nil {
				return err
			}
			ckpt, err := checkpoint.Open(loc.Dir)
			if err != nil {
				return err
			}
			reg := loadPlugins(c)
			defer reg.Close()
			report := inspectCheckpoint(c, ckpt, reg)
			report.HubID, report.Revision, report.Commit = loc.HubID, loc.Revision, loc.Commit
			if c.Bool("json") {
				if err := emitJSON(c, report); err != nil {
					return err
				}
			} else {
				report.print(reportOut(c))
			}
			if !report.Supported {
				// The report is printed; the exit status says strata cannot export it.
				if !c.Bool("json") {
					return fmt.Errorf("strata cannot export %s (the reasons are above)", model)
				}
				return fmt.Errorf("strata cannot export %s: %s", model, strings.Join(report.Reasons, "; "))
			}
			return nil
		},
	}
}

type inspectReport struct {
	Checkpoint string `json:"checkpoint"`
	// HubID, Revision, Commit: when MODEL was found in the Hugging Face cache.
	HubID              string         `json:"hub_id,omitempty"`
	Revision           string         `json:"revision,omitempty"`
	Commit             string         `json:"commit,omitempty"`
	ModelType          string         `json:"model_type"`
	Architectures      []string       `json:"architectures"`
	Config             archNumbers    `json:"config"`
	Plugin             *pluginRef     `json:"plugin"`
	Layers             int            `json:"layers"`
	LayerKinds         map[string]int `json:"layer_kinds"`
	Parameters         int64          `json:"parameters"`
	DTypes             []dtypeCount   `json:"dtypes"`
	Shards             []shardReport  `json:"shards"`
	Bytes              int64          `json:"bytes"`
	Supported          bool           `json:"supported"`
	LayerwiseSupported bool           `json:"layerwise_supported"`
	Reasons            []string       `json:"reasons,omitempty"`
	// MTP is the multi-token-prediction layout the plugin found.
	MTP *mtpReport `json:"mtp,omitempty"`
	// Quantization is how the weights are quantised (absent: they are not).
	Quantization *quantReport `json:"quantization,omitempty"`
	// ExpertLayout is the MoE expert layout found in the keys (absent: none).
	ExpertLayout *expertsReport `json:"expert_layout,omitempty"`
	// Options are the plugin options that apply to this model_type.
	Options []*pb.PluginOption `json:"options,omitempty"`
}

type quantReport struct {
	Method   string   `json:"method"`
	Format   string   `json:"format"`
	Weights  int      `json:"weights"` // quantised weights (each counted once, with its logical shape)
	Scales   int      `json:"scales"`  // stored tensors that are scales, zero points, packing shapes: not parameters
	Excluded []string `json:"excluded,omitempty"`
	Notes    []string `json:"notes,omitempty"`
}

type mtpReport struct {
	Convention string   `json:"convention"`
	Layers     []int32  `json:"layers"`
	Keys       []string `json:"keys"`
}

type pluginRef struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Path    string `json:"path"`
}

type dtypeCount struct {
	DType      string `json:"dtype"`
	Tensors    int    `json:"tensors"`
	Parameters int64  `json:"parameters"`
}

type shardReport struct {
	Name    string `json:"name"`
	Bytes   int64  `json:"bytes"`
	Tensors int    `json:"tensors"`
}

func inspectCheckpoint(c *cli.Context, ckpt *checkpoint.Checkpoint, reg *plugins.Registry) inspectReport {
	r := inspectReport{Checkpoint: ckpt.Dir, ModelType: ckpt.ModelType, Architectures: ckpt.Architectures, LayerKinds: map[string]int{},
		Config: readArchNumbers(ckpt.ConfigJSON)}
	q, err := quant.Read(ckpt)
	r.countTensors(ckpt, q)
	r.ExpertLayout = detectExperts(ckpt)
	if err != nil {
		r.Reasons = []string{err.Error()}
		return r
	}
	p, err := reg.For(ckpt.ModelType)
	if err != nil {
		r.Reasons = []string{err.Error()}
		return r
	}
	r.Plugin = &pluginRef{Name: p.Desc.GetName(), Version: p.Desc.GetVersion(), Path: p.Path}
	if support, ok := p.Support(ckpt.ModelType); ok {
		r.Options = support.GetOptions()
	}
	model := export.Model(ckpt, q)
	check, err := p.Check(c.Context, model)
	if err != nil {
		r.Reasons = []string{err.Error()}
		return r
	}
	r.Supported, r.LayerwiseSupported, r.Reasons = check.GetSupported(), check.GetLayerwiseSupported(), check.GetReasons()
	if support, ok := p.Support(ckpt.ModelType); ok && !support.GetCapabilities().GetLayerwise() {
		r.LayerwiseSupported = false
		if why := support.GetCapabilities().GetLayerwiseReason(); why != "" {
			r.Reasons = append(r.Reasons, "layerwise: "+why)
		}
	}
	if !r.Supported {
		return r
	}
	plan, err := p.Plan(c.Context, &pb.PlanRequest{Model: model})
	if err != nil {
		r.Supported, r.Reasons = false, append(r.Reasons, err.Error())
		return r
	}
	r.Layers = len(plan.GetLayers())
	if m := plan.GetMtp(); m != nil {
		r.MTP = &mtpReport{Convention: m.GetConvention(), Layers: m.GetLayers(), Keys: m.GetKeys()}
	}
	for _, l := range plan.GetLayers() {
		r.LayerKinds[l.GetKind()]++
	}
	return r
}

// countTensors counts parameters as the model has them: a quantised
// weight once, with its logical shape, under the dtype it is stored in;
// scales, zero points and packing shapes are no parameters.
func (r *inspectReport) countTensors(ckpt *checkpoint.Checkpoint, q *quant.View) {
	byDType := map[string]*dtypeCount{}
	count := func(dt string, n int64) {
		d := byDType[dt]
		if d == nil {
			d = &dtypeCount{DType: dt}
			byDType[dt] = d
		}
		d.Tensors++
		d.Parameters += n
		r.Parameters += n
	}
	scales := 0
	for _, sh := range ckpt.Shards {
		r.Shards = append(r.Shards, shardReport{Name: sh.Name, Bytes: sh.Size, Tensors: len(sh.Tensors)})
		r.Bytes += sh.Size
		for _, t := range sh.Tensors {
			if q.Auxiliary(t.Key) {
				scales++
			} else if !q.Has(t.Key) && !q.Stored(t.Key) {
				count(t.DType, t.Elements())
			}
		}
	}
	for _, w := range q.Weights() { // under the dtype of its stored values
		values, _ := ckpt.Tensor(w.Values)
		count(values.DType, w.Elements())
	}
	if q.Quantized() || q != nil && q.Method != "" {
		r.Quantization = &quantReport{Method: q.Method, Format: q.Format, Weights: q.Len(), Scales: scales,
			Excluded: q.Excluded, Notes: q.Notes}
	}
	for _, d := range byDType {
		r.DTypes = append(r.DTypes, *d)
	}
	sort.Slice(r.DTypes, func(i, j int) bool { return r.DTypes[i].Parameters > r.DTypes[j].Parameters })
}

func (r inspectReport) print(w io.Writer) {
	// Labels are the --json names (config numbers: their short names).
	row := func(k, v string) { fmt.Fprintf(w, "%-19s %s\n", k, v) }
	row("checkpoint", r.Checkpoint)
	if r.HubID != "" {
		row("hub", fmt.Sprintf("%s, revision %s, commit %s (Hugging Face cache)", r.HubID, r.Revision, r.Commit))
	}
	row("model_type", fmt.Sprintf("%s (%s)", r.ModelType, strings.Join(r.Architectures, ", ")))
	if r.Plugin != nil {
		row("plugin", fmt.Sprintf("%s %s (%s)", r.Plugin.Name, r.Plugin.Version, r.Plugin.Path))
	} else {
		row("plugin", "none")
	}
	if r.Layers > 0 {
		row("layers", fmt.Sprintf("%d (%s)", r.Layers, kindsText(r.LayerKinds)))
	} else if r.Config.Layers > 0 {
		row("layers", fmt.Sprintf("%d (config.json)", r.Config.Layers))
	}
	r.Config.print(row)
	if r.MTP != nil {
		where := r.MTP.Convention
		if len(r.MTP.Layers) > 0 { // indexed mtp.* keys have none
			where += fmt.Sprintf(", layers %v", r.MTP.Layers)
		}
		row("mtp", where+", "+plural(len(r.MTP.Keys), "tensor"))
	}
	if qr := r.Quantization; qr != nil {
		row("quantization", fmt.Sprintf("%s: %s; %s dequantised in the graph, %s not counted as parameters", qr.Method, qr.Format,
			plural(qr.Weights, "weight"), plural(qr.Scales, "scale tensor")))
		if n := len(qr.Excluded); n > 0 { // --json lists them all
			shown := qr.Excluded
			if n > 6 {
				shown = append(slices.Clone(shown[:5]), fmt.Sprintf("and %d more", n-5))
			}
			row("not quantised", strings.Join(shown, ", "))
		}
		for _, n := range qr.Notes {
			row("note", n)
		}
	}
	if r.ExpertLayout != nil {
		row("expert_layout", r.ExpertLayout.String())
	}
	if len(r.Options) > 0 {
		var b strings.Builder
		printOptions(&b, "", r.Options)
		for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
			row("options", line)
		}
	}
	row("parameters", fmt.Sprintf("%s (%d)", human(r.Parameters, ""), r.Parameters))
	var dts []string
	for _, d := range r.DTypes {
		dts = append(dts, fmt.Sprintf("%s: %d tensors, %s params", d.DType, d.Tensors, human(d.Parameters, "")))
	}
	row("dtypes", strings.Join(dts, "; "))
	tensors := 0
	for _, s := range r.Shards {
		tensors += s.Tensors
	}
	// Every shard is listed by --json; here only their sum.
	row("shards", fmt.Sprintf("%s, %s, %s", plural(len(r.Shards), "file"), human(r.Bytes, "B"), plural(tensors, "tensor")))
	row("supported", yesNo(r.Supported, ""))
	row("layerwise_supported", yesNo(r.LayerwiseSupported, ""))
	for _, why := range r.Reasons {
		row("reasons", why)
	}
}

func kindsText(kinds map[string]int) string {
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s ×%d", k, kinds[k])
	}
	return strings.Join(parts, ", ")
}

// human prints n with a k/M/G/T suffix (powers of 1000).
func human(n int64, unit string) string {
	f := float64(n)
	for _, s := range []string{"", "k", "M", "G", "T"} {
		if f < 1000 || s == "T" {
			if s == "" {
				return strings.TrimSpace(fmt.Sprintf("%d %s", n, unit))
			}
			return strings.TrimSpace(fmt.Sprintf("%.2f %s%s", f, s, unit))
		}
		f /= 1000
	}
	return ""
}
