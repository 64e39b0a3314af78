package main

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/export"
	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/weights"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func exportCommand() *cli.Command {
	return &cli.Command{
		Name:        "export",
		Usage:       "export a checkpoint to DIR/model.onnx and DIR/weight_spec.json, weights referenced in place",
		ArgsUsage:   modelArgs,
		Description: modelHelp,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "out", Aliases: []string{"o"}, Required: true, Usage: "output `DIR` (created; may hold only an earlier strata export)"},
			&cli.BoolFlag{Name: "overwrite", Usage: "replace the files strata's manifest in DIR records even if they changed since (a damaged export, as strata check reports it); anything else in DIR is still refused"},
			&cli.BoolFlag{Name: "dry-run", Usage: "build the model in memory and report what would be written (files and sizes, model.onnx's inputs and outputs, windows, what is read); DIR is not created and nothing is written"},
			&cli.StringFlag{Name: "target", Value: export.TargetQAIC, Usage: "the graph's form: qaic (QEfficient's IO and ops, for the Qualcomm AI 100 toolchain and strata compile) or ort (ONNX Runtime's contrib ops and onnxruntime-genai's decoder IO, with genai_config.json and the tokenizer files: for serving with ONNX Runtime); plugins list their targets in `strata archs`"},
			&cli.StringFlag{Name: "logits", Usage: "the rows of logits with --target ort: all (every position, [batch, sequence_length, vocab]: the default) or last (each row's last valid token, [batch, 1, vocab]: what generation reads; onnxruntime-genai runs it as a pruned model, prefill skips the vocabulary projection of every other position and its buffer); the qaic form's are always the last token's"},
			jsonFlag(),
		}, exportFlags()...),
		Action: func(c *cli.Context) error {
			dir, err := oneArg(c, modelArgs)
			if err != nil {
				return err
			}
			out, err := outFlag(c)
			if err != nil {
				return err
			}
			opts, err := exportOptions(c, out)
			if err != nil {
				return err
			}
			opts.Overwrite, opts.DryRun = c.Bool("overwrite"), c.Bool("dry-run")
			_, summary, err := runExport(c, dir, opts)
			if err != nil || !c.Bool("json") {
				return overwriteHint(err)
			}
			if summary.plan != nil {
				return emitJSON(c, summary.plan)
			}
			return emitJSON(c, summary)
		},
	}
}

// exportFlags are the export options, shared with compile.
func exportFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "dtype", Value: "float32", Usage: "compute dtype of the graph: float32 or float16 (weights are cast in-graph)"},
		&cli.StringFlag{Name: "link", Value: weights.LinkAuto, Usage: "how DIR/checkpoint reaches the shards: auto (reflink where the file system can, else hardlink, saying why), reflink (a copy-on-write clone: every loader, nothing copied; btrfs/XFS), hardlink (nothing copied, any file system; the onnx package refuses it), copy (every loader, the shards' space and time), symlink (for compilers that read the checkpoint; ONNX Runtime refuses it)"},
		&cli.StringFlag{Name: "weights", Value: weights.Reference, Usage: "reference: initializers point into the checkpoint, transforms are graph nodes; materialize: strata computes the weights into DIR/weights/*.safetensors"},
		&cli.StringFlag{Name: "shard-size", Value: "5GB", Usage: "with --weights materialize: the largest data file, as save_pretrained's max_shard_size (bytes, or with kB, MB, GB, KiB, MiB, GiB); more weights go to model-0000i-of-0000N.safetensors with an index"},
		&cli.StringFlag{Name: "weight-spec", Usage: "also write another weight spec format: qaic (QEfficient version 5, weights as graph inputs; needs --weights materialize)"},
		revisionFlag(),
		&cli.StringFlag{Name: "bin-to", Usage: "for a PyTorch .bin checkpoint: convert it to safetensors in `DIR` (once; reused while the .bin files are unchanged) and export that"},
		&cli.BoolFlag{Name: "subfunctions", Usage: "make each decoder layer a call of an ONNX local function, one per layer kind (default: inlined); also the leaner form for ONNX Runtime to open"},
		&cli.BoolFlag{Name: "continuous-batching", Usage: "serve with continuous batching: a batch_index input picks each row's KV-cache slot (cache of full_batch_size rows)"},
		&cli.BoolFlag{Name: "ccl", Usage: "compute-context-length: a comp_ctx_lengths input whose length is how many cache rows attention reads"},
		&cli.StringSliceFlag{Name: "plugin-option", Usage: "pass `KEY=VALUE` to the plugin (repeatable; also written --KEY VALUE, dashes for underscores, e.g. --moe-strategy dense); `strata archs` lists each plugin's options, and a plugin refuses keys it does not know"},
		&cli.StringSliceFlag{Name: "extra-model", Usage: "also export the plugin's separate model `NAME` (e.g. vision) as DIR/NAME.onnx (repeatable; `strata archs` lists each architecture's models)"},
		&cli.BoolFlag{Name: "layerwise", Usage: "export windows of --window-size layers as models of their own, then stitch them into model.onnx"},
		&cli.IntFlag{Name: "window-size", Value: 1, Usage: "decoder layers per window, with --layerwise"},
		&cli.BoolFlag{Name: "keep-windows", Usage: "also write each window as DIR/windows/window_<first>_<last>.onnx and keep it (re-runs then skip unchanged windows)"},
		&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: runtime.NumCPU(), DefaultText: "the number of CPUs", Usage: "windows exported (and compiled) at once"},
	}
}

// runExport exports the checkpoint in dir and reports it (in text, unless
// --json: then the caller prints the summary).
func runExport(c *cli.Context, dir string, opts export.Options) (*export.Result, *exportSummary, error) {
	start := time.Now()
	tuneExportGC(opts.Weights == weights.Materialize)
	// The plugins start while the checkpoint's headers are read.
	started := make(chan *plugins.Registry, 1)
	go func() { started <- startPlugins(c) }()
	ckpt, loc, err := openCheckpoint(c, dir, c.String("bin-to"))
	reg := announcePlugins(c, <-started)
	defer reg.Close()
	if err != nil {
		return nil, nil, err
	}
	opts.CheckpointName = loc.Name()
	p, err := reg.For(ckpt.ModelType)
	if err != nil {
		return nil, nil, err
	}
	reg.StopOthers(p)
	if err := checkPluginOptions(c, p, ckpt.ModelType, opts.PluginOptions); err != nil {
		return nil, nil, err
	}
	res, err := export.Run(c.Context, p, ckpt, opts)
	var kept *export.KeptWindowsError
	if errors.As(err, &kept) && c.Context.Err() != nil { // run reports only "interrupted"
		fmt.Fprintf(c.App.ErrWriter, "strata: %v\n", kept)
	}
	var lw *export.LayerwiseError
	if errors.As(err, &lw) {
		return nil, nil, fmt.Errorf("%w\narchitectures whose plugins support --layerwise: %s", err, layerwiseArchs(reg))
	}
	if err != nil {
		return nil, nil, err
	}
	recordBytesRead(c, ckpt.BytesRead)
	if res.Planned != nil { // --dry-run: the report is the command's point, -q or not
		plan := planExport(p, ckpt, loc, opts, res)
		plan.print(reportOut(c))
		return res, &exportSummary{plan: plan}, nil
	}
	summary := summarizeExport(start, p, ckpt, loc, opts, res)
	summary.print(textOut(c))
	for _, n := range res.Notes {
		note(c, "%s", n)
	}
	return res, summary, nil
}

func exportOptions(c *cli.Context, out string) (export.Options, error) {
	opts := export.Options{
		Out: out, ComputeDType: c.String("dtype"), Link: c.String("link"), Version: version,
		ContinuousBatching: c.Bool("continuous-batching"), CCL: c.Bool("ccl"),
		Weights: c.String("weights"), WeightSpec: c.String("weight-spec"), Subfunctions: c.Bool("subfunctions"), Layerwise: c.Bool("layerwise"), WindowSize: c.Int("window-size"),
		KeepWindows: c.Bool("keep-windows"), Jobs: c.Int("jobs"), Models: c.StringSlice("extra-model"), Target: c.String("target"), Logits: c.String("logits"),
		Progress: progressOut(c), TTY: isTerminal(c.App.ErrWriter),
	}
	var err error
	if opts.ShardBytes, err = parseSize(c.String("shard-size")); err != nil {
		return opts, usageError{fmt.Sprintf("--shard-size %q: %v", c.String("shard-size"), err)}
	}
	if c.IsSet("shard-size") && opts.Weights != weights.Materialize {
		return opts, usageError{"--shard-size is for --weights materialize (referenced weights stay in the checkpoint's own shards)"}
	}
	if opts.PluginOptions, err = pluginOptions(c); err != nil {
		return opts, err
	}
	if !opts.Layerwise && (c.IsSet("window-size") || c.IsSet("keep-windows")) {
		return opts, usageError{"--window-size and --keep-windows need --layerwise"}
	}
	if opts.WindowSize < 1 {
		return opts, usageError{fmt.Sprintf("--window-size must be at least 1, got %d", opts.WindowSize)}
	}
	if opts.Jobs < 1 {
		return opts, usageError{fmt.Sprintf("-j must be at least 1, got %d", opts.Jobs)}
	}
	return opts, nil
}

// overwriteHint adds, to a refusal of files strata wrote that changed
// since, the way to replace them.
func overwriteHint(err error) error {
	var oe *outdir.Error
	if !errors.As(err, &oe) || len(oe.Changed) == 0 {
		return err
	}
	return fmt.Errorf("%w\n%s changed since strata wrote it; if that is damage, the same command with --overwrite replaces strata's own files even so (and nothing else)",
		err, strings.Join(oe.Changed, ", "))
}

// pluginOptions gathers --plugin-option KEY=VALUE (the CLI rewrote any
// --KEY VALUE strata has no flag for into one) for the plugin. A bare KEY
// (--vision) is left empty for checkPluginOptions to settle.
func pluginOptions(c *cli.Context) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range c.StringSlice("plugin-option") {
		k, v, _ := strings.Cut(kv, "=")
		if k == "" {
			return nil, usageError{fmt.Sprintf("--plugin-option %q: want KEY=VALUE", kv)}
		}
		out[k] = v
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// checkPluginOptions refuses, before any work, options the plugin does not
// declare for the architecture: a usage error, as an unknown flag is (an
// unknown --foo-bar V became the plugin option foo_bar).
func checkPluginOptions(c *cli.Context, p *plugins.Plugin, modelType string, opts map[string]string) error {
	support, ok := p.Support(modelType)
	if !ok || len(opts) == 0 {
		return nil
	}
	declared := map[string]bool{}
	var names []string
	for _, o := range support.GetOptions() {
		declared[o.GetName()] = true
		names = append(names, "--"+strings.ReplaceAll(o.GetName(), "_", "-"))
	}
	var unknown []string
	for k := range opts {
		if !declared[k] {
			unknown = append(unknown, "--"+strings.ReplaceAll(k, "_", "-"))
		}
	}
	if len(unknown) == 0 {
		return settleBare(c, support.GetOptions(), opts)
	}
	sort.Strings(unknown)
	has := "none"
	if len(names) > 0 {
		has = strings.Join(names, ", ")
	}
	return usageError{fmt.Sprintf("unknown flag or plugin option %s: not a flag of strata %s, and plugin %s declares no such option for %s (its options: %s); see strata %s --help",
		strings.Join(unknown, ", "), c.Command.Name, p.Desc.GetName(), modelType, has, c.Command.Name)}
}

// settleBare gives each option written bare (--vision, --plugin-option
// vision) the value true when the plugin declares it boolean, as a boolean
// flag; any other option needs a value, and says which.
func settleBare(c *cli.Context, declared []*pb.PluginOption, opts map[string]string) error {
	for _, kv := range c.StringSlice(pluginOptionFlag) {
		if strings.Contains(kv, "=") {
			continue
		}
		for _, o := range declared {
			if o.GetName() != kv {
				continue
			}
			if allowed := slices.Sorted(slices.Values(o.GetAllowedValues())); slices.Equal(allowed, []string{"false", "true"}) {
				opts[kv] = "true"
				break
			}
			flag := "--" + strings.ReplaceAll(kv, "_", "-")
			values := "a value"
			if len(o.GetAllowedValues()) > 0 {
				values = "one of " + strings.Join(o.GetAllowedValues(), ", ")
			}
			return usageError{fmt.Sprintf("%s needs a value: %s (default %s), e.g. %s %s; see strata %s --help",
				flag, values, o.GetDefaultValue(), flag, o.GetDefaultValue(), c.Command.Name)}
		}
	}
	return nil
}

// layerwiseArchs lists the model_types whose plugin supports --layerwise.
func layerwiseArchs(reg *plugins.Registry) string {
	var out []string
	for _, mt := range reg.ModelTypes() {
		p, _ := reg.For(mt)
		if a, ok := p.Support(mt); ok && a.GetCapabilities().GetLayerwise() {
			out = append(out, fmt.Sprintf("%s (%s)", mt, p.Desc.GetName()))
		}
	}
	if len(out) == 0 {
		return "none of the plugins found"
	}
	return strings.Join(out, ", ")
}

func linkVerb(mode string) string {
	switch mode {
	case weights.LinkReflink:
		return "cloned (reflink)"
	case weights.LinkCopy:
		return "copied"
	case weights.LinkSymlink:
		return "symlinked"
	default:
		return "hard-linked"
	}
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
