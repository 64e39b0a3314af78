package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/convert"
)

func convertCommand() *cli.Command {
	return &cli.Command{
		Name:      "convert",
		Usage:     "re-write a checkpoint one decoder layer at a time (dtype change, FP8/MXFP4 dequantisation, FP8 quantisation), MTP weights carried whole",
		ArgsUsage: "MODEL",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Aliases: []string{"o"}, Required: true, Usage: "output `DIR` (new, empty, or this same conversion, which is resumed)"},
			revisionFlag(),
			&cli.StringFlag{Name: "dtype", Usage: "write float tensors as bfloat16, float16 or float32, dequantising FP8 and MXFP4 sources (default: as stored)"},
			&cli.StringFlag{Name: "quantize", Usage: "none (dequantise a quantised source to --dtype, bfloat16 by default), fp8-block (E4M3 + weight_scale_inv per 128×128 block: transformers' FineGrainedFP8) or fp8-dynamic (compressed-tensors FP8_DYNAMIC: per-channel weights, dynamic per-token activations)"},
			&cli.StringFlag{Name: "layers", Usage: "convert only decoder layers `FIRST-LAST` (inclusive), e.g. to split a conversion over machines sharing DIR; auto: this scheduler task's share (JOB_COMPLETION_INDEX of a Kubernetes Indexed Job, SLURM_ARRAY_TASK_ID of a Slurm array)"},
			&cli.IntFlag{Name: "tasks", Usage: "with --layers auto: how many tasks share the conversion (a Kubernetes Job's completions; a Slurm array's SLURM_ARRAY_TASK_COUNT by default)"},
			&cli.BoolFlag{Name: "finalize", Usage: "write tail, config, report and index once every layer is present (alone: convert no layer; refuses, naming the missing layers)"},
			&cli.BoolFlag{Name: "dry-run", Usage: "report what would be written (shards and sizes, the files --finalize writes) and read, as into a new DIR; DIR is not created and nothing is written"},
			&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: min(runtime.NumCPU(), 4), DefaultText: "the number of CPUs, at most 4", Usage: "layers converted at once"},
			jsonFlag(),
		},
		Action: func(c *cli.Context) error {
			model, err := oneArg(c, "MODEL")
			if err != nil {
				return err
			}
			out, err := outFlag(c)
			if err != nil {
				return err
			}
			loc, err := locateModel(c, model) // a directory, a Hugging Face cache repository or hub id
			if err != nil {
				return err
			}
			dir := loc.Dir
			opts := convert.Options{
				DType:    c.String("dtype"),
				Quantize: c.String("quantize"),
				Finalize: c.Bool("finalize"),
				Jobs:     c.Int("jobs"),
				Progress: progressOut(c),
				TTY:      isTerminal(c.App.ErrWriter),
				DryRun:   c.Bool("dry-run"),
			}
			if c.IsSet("tasks") && (c.String("layers") != "auto" || c.Int("tasks") < 1) {
				return usageError{fmt.Sprintf("--tasks %d: give a count ≥ 1, with --layers auto", c.Int("tasks"))}
			}
			if s := c.String("layers"); s == "auto" {
				t, err := schedulerTask(os.Getenv, c.Int("tasks"))
				if err != nil {
					return err
				}
				opts.Task = &t
			} else if c.IsSet("layers") { // --layers "" is a mistake, not the whole model
				r, err := parseLayers(s)
				if err != nil {
					return err
				}
				opts.Layers = &r
			}
			opts.MTP = pluginMTP(c, dir)
			res, err := convert.Convert(c.Context, dir, out, opts)
			if err != nil {
				if c.Context.Err() != nil { // run reports only "interrupted"
					fmt.Fprintf(c.App.ErrWriter, "strata: %v\n", err)
				}
				return err
			}
			if opts.DryRun {
				plan := planConvert(res, opts)
				plan.print(reportOut(c))
				if c.Bool("json") {
					return emitJSON(c, plan)
				}
				return nil
			}
			reportConvert(textOut(c), res, opts)
			if c.Bool("json") {
				return emitJSON(c, summarizeConvert(res, opts))
			}
			return nil
		},
	}
}

// outFlag is --out, which must name a directory: "" is refused (exit 2)
// rather than taken for the current directory or compared with the source.
func outFlag(c *cli.Context) (string, error) {
	out := c.String("out")
	if out == "" {
		return "", usageError{`--out "": no output directory; pass --out DIR`}
	}
	return out, nil
}

// parseLayers parses "A-B" or "A".
func parseLayers(s string) (convert.Range, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		b = a
	}
	from, err1 := strconv.Atoi(strings.TrimSpace(a))
	to, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil || from < 0 || to < from {
		return convert.Range{}, usageError{fmt.Sprintf("--layers %q: give FIRST-LAST, e.g. 0-15 (inclusive, 0 ≤ FIRST ≤ LAST)", s)}
	}
	return convert.Range{From: from, To: to}, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

func reportConvert(w io.Writer, res *convert.Result, opts convert.Options) {
	what := "converted"
	if opts.DType != "" {
		what += " to " + opts.DType
	}
	if opts.Quantize != "" && opts.Quantize != convert.QuantNone {
		what += ", quantised " + opts.Quantize
	}
	fmt.Fprintf(w, "%s: %d of %d layers written by this run, %d already present, in %s\n", what, len(res.Written), res.Layers, len(res.Kept), res.Out)
	if opts.Task != nil {
		fmt.Fprintf(w, "  %s (--layers auto): layers %s\n", opts.Task, layerList(slices.Concat(res.Written, res.Kept)))
	}
	if !res.Finalized {
		fmt.Fprintf(w, "  not finalized: run with --finalize once every layer is converted (the index appears only then)\n")
		return
	}
	fmt.Fprintf(w, "  %d source tensors: %d written, %d dropped on purpose; %d tensors in the output (%s)\n",
		res.Sources, res.Sources-res.Dropped, res.Dropped, res.Outputs, convert.ReportFile)
	for _, d := range res.MTP.Descriptions {
		fmt.Fprintf(w, "  MTP (%s): %d tensors carried unquantised", d.Convention, len(res.MTP.Keys))
		if len(res.MTP.Prefixes) > 0 {
			fmt.Fprintf(w, ", excluded as %s", strings.Join(res.MTP.Prefixes, ", "))
		}
		fmt.Fprintln(w)
	}
	if len(res.Exclusions) > 0 {
		fmt.Fprintf(w, "  quantization_config excludes %d modules (routers, embeddings, lm_head, norms, MTP)\n", len(res.Exclusions))
	}
	rate := 0.0
	if s := res.Elapsed.Seconds(); s > 0 {
		rate = float64(res.TensorBytes) / s / 1e6
	}
	fmt.Fprintf(w, "  in %s; %.1f MB written (%.0f MB/s)\n", res.Elapsed.Round(1e6), float64(res.TensorBytes)/1e6, rate)
}

// convertSummary is convert's --json result: what the text report says.
type convertSummary struct {
	Command      string       `json:"command"`
	Out          string       `json:"out"`
	DType        string       `json:"dtype,omitempty"`
	Quantize     string       `json:"quantize,omitempty"`
	Layers       int          `json:"layers"`
	Written      []int        `json:"layers_written"`
	Kept         []int        `json:"layers_kept"`
	Finalized    bool         `json:"finalized"`
	Sources      int          `json:"source_tensors"`
	Dropped      int          `json:"dropped_tensors"`
	Outputs      int          `json:"output_tensors"`
	MTP          []string     `json:"mtp_keys"`
	TensorBytes  int64        `json:"tensor_bytes_written"`
	Seconds      float64      `json:"seconds"`
	Files        []writtenRef `json:"files"`
	Exclusions   []string     `json:"quantization_exclusions,omitempty"`
	Quantization string       `json:"quantization,omitempty"`
}

func summarizeConvert(res *convert.Result, opts convert.Options) convertSummary {
	s := convertSummary{Command: "convert", Out: res.Out, DType: opts.DType, Quantize: res.Quantization, Layers: res.Layers,
		Written: orEmpty(res.Written), Kept: orEmpty(res.Kept), Finalized: res.Finalized, Sources: res.Sources, Dropped: res.Dropped,
		Outputs: res.Outputs, MTP: []string{}, TensorBytes: res.TensorBytes, Seconds: res.Elapsed.Seconds(), Files: []writtenRef{},
		Exclusions: res.Exclusions}
	if res.MTP != nil {
		s.MTP = append(s.MTP, res.MTP.Keys...)
	}
	entries, _ := os.ReadDir(res.Out)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() && !strings.HasPrefix(e.Name(), ".strata-") {
			s.Files = append(s.Files, writtenRef{Path: filepath.Join(res.Out, e.Name()), Bytes: info.Size(), What: "convert"})
		}
	}
	return s
}

func orEmpty(xs []int) []int {
	if xs == nil {
		return []int{}
	}
	return xs
}
