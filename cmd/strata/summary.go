package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/export"
	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/host/window"
)

// jsonFlag makes export and compile print one JSON object on stdout.
func jsonFlag() cli.Flag {
	return &cli.BoolFlag{Name: "json", Usage: "print the result as one JSON object on stdout (the facts of the text summary)"}
}

// exportSummary is what an export reports: the text summary and --json
// carry the same facts under the same names.
type exportSummary struct {
	Command string `json:"command"`
	exportFacts
	// GraphWeights are the weights the graph uses; CheckpointFiles the
	// checkpoint shards they are read from (reached through checkpoint/).
	GraphWeights    int          `json:"graph_weights"`
	CheckpointFiles int          `json:"checkpoint_files"`
	Files           []writtenRef `json:"files"`
	Windows         *windowsRef  `json:"windows,omitempty"`
	// CheckpointBytesRead counts config, index and headers; HeadersOnly
	// says no tensor data was read (reference mode).
	CheckpointBytesRead int64    `json:"checkpoint_bytes_read"`
	HeadersOnly         bool     `json:"headers_only"`
	Seconds             float64  `json:"seconds"`
	Notes               []string `json:"notes,omitempty"`

	plan *exportPlan // --dry-run's report instead
}

// exportFacts are what an export's summary and its dry run both say.
type exportFacts struct {
	ModelType string `json:"model_type"`
	Plugin    struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"plugin"`
	Checkpoint   checkpointRef  `json:"checkpoint"`
	Out          string         `json:"out"`
	Layers       int            `json:"layers"`
	LayerKinds   map[string]int `json:"layer_kinds"`
	Parameters   int64          `json:"parameters"`
	ComputeDType string         `json:"compute_dtype"`
	// Weights: "reference" or "materialize"; Link: how checkpoint/ reaches the shards.
	Weights string `json:"weights"`
	Link    string `json:"link"`
}

func factsOf(p *plugins.Plugin, ckpt *checkpoint.Checkpoint, loc checkpoint.Location, opts export.Options, res *export.Result) exportFacts {
	f := exportFacts{ModelType: ckpt.ModelType, Out: opts.Out,
		Checkpoint: checkpointRef{Name: loc.Name(), HubID: loc.HubID, Revision: loc.Revision, Commit: loc.Commit},
		Layers:     len(res.Plan.GetLayers()), LayerKinds: map[string]int{}, Parameters: res.Parameters,
		ComputeDType: res.Spec.ComputeDType, Weights: res.Spec.Mode, Link: opts.Link}
	f.Plugin.Name, f.Plugin.Version = p.Desc.GetName(), p.Desc.GetVersion()
	for _, l := range res.Plan.GetLayers() {
		f.LayerKinds[l.GetKind()]++
	}
	return f
}

type checkpointRef struct {
	Name     string `json:"name"`
	HubID    string `json:"hub_id,omitempty"`
	Revision string `json:"revision,omitempty"`
	Commit   string `json:"commit,omitempty"`
}

// writtenRef is a file a command wrote, its path as the user would type it.
type writtenRef struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
	// What: model, weight_spec, weights, window, manifest, compile…
	What string `json:"what"`
}

type windowsRef struct {
	Count   int      `json:"count"`
	Written []string `json:"written"`
	Kept    []string `json:"kept"`
	// KeptFiles says whether windows/ stays after stitching (--keep-windows).
	KeptFiles bool `json:"kept_files"`
}

func summarizeExport(start time.Time, p *plugins.Plugin, ckpt *checkpoint.Checkpoint, loc checkpoint.Location, opts export.Options, res *export.Result) *exportSummary {
	s := &exportSummary{Command: "export", exportFacts: factsOf(p, ckpt, loc, opts, res), GraphWeights: len(res.Spec.Weights),
		CheckpointBytesRead: ckpt.BytesRead, Notes: res.Notes}
	for _, f := range res.Spec.Files { // what --link auto chose
		if f.Kind == weights.KindCheckpoint && f.Link != "" {
			s.Link = f.Link
			break
		}
	}
	if s.Link == "" || s.Link == weights.LinkAuto {
		s.Link = weights.LinkHard
	}
	s.HeadersOnly = s.Weights == weights.Reference && s.Link != weights.LinkCopy
	add := func(rel, what string) {
		path := filepath.Join(opts.Out, filepath.FromSlash(rel))
		if info, err := os.Stat(path); err == nil && info.Mode().IsRegular() {
			s.Files = append(s.Files, writtenRef{Path: path, Bytes: info.Size(), What: what})
		}
	}
	add(export.ModelFile, "model")
	for _, m := range res.SeparateModels {
		add(filepath.Base(m.Path), "model")
	}
	add(export.SpecFile, "weight_spec")
	add(weights.QAICSpecFile, "weight_spec")
	if opts.Target == export.TargetORT {
		for _, name := range export.ORTFiles() {
			add(name, "genai")
		}
	}
	var indexes []string
	for _, f := range res.Spec.Files {
		if f.Kind == weights.KindCheckpoint {
			s.CheckpointFiles++
			continue
		}
		add(f.Path, "weights")
		if idx, ok := weights.IndexOf(f.Path); ok && !slices.Contains(indexes, idx) {
			indexes = append(indexes, idx)
		}
	}
	for _, idx := range indexes {
		add(idx, "weights_index")
	}
	if n := len(res.WindowsWritten) + len(res.WindowsKept); n > 0 {
		s.Windows = &windowsRef{Count: n, Written: nonNil(res.WindowsWritten), Kept: nonNil(res.WindowsKept), KeptFiles: opts.KeepWindows}
		if opts.KeepWindows {
			files, _ := filepath.Glob(filepath.Join(opts.Out, window.Dir, "window_*.onnx"))
			sort.Strings(files)
			for _, f := range files {
				rel, _ := filepath.Rel(opts.Out, f)
				add(rel, "window")
			}
		}
		add(window.ManifestFile, "manifest")
	}
	s.Seconds = time.Since(start).Seconds()
	return s
}

func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

// print is the text summary.
func (s *exportSummary) print(w io.Writer) {
	fmt.Fprintf(w, "exported %s with plugin %s %s: %d layers, %s parameters, compute %s\n",
		s.ModelType, s.Plugin.Name, s.Plugin.Version, s.Layers, human(s.Parameters, ""), s.ComputeDType)
	for _, f := range s.Files {
		extra := ""
		switch {
		case f.What == "weight_spec" && filepath.Base(f.Path) == export.SpecFile:
			extra = fmt.Sprintf(", %d weights", s.GraphWeights)
			switch {
			case s.CheckpointFiles > 0 && s.Weights == weights.Materialize:
				extra += fmt.Sprintf(" materialised from %s (%s into %s/ as their provenance; the model reads weights/)", plural(s.CheckpointFiles, "checkpoint file"), linkVerb(s.Link), weights.DataDir)
			case s.CheckpointFiles > 0:
				extra += fmt.Sprintf(" read from %s, %s into %s/", plural(s.CheckpointFiles, "checkpoint file"), linkVerb(s.Link), weights.DataDir)
			}
		case f.What == "weights":
			extra = ", materialised weights"
		case f.What == "weights_index":
			extra = ", index of the materialised shards"
		}
		fmt.Fprintf(w, "  %s (%s%s)\n", f.Path, human(f.Bytes, "B"), extra)
	}
	switch {
	case s.Windows == nil:
	case !s.Windows.KeptFiles && s.Weights == weights.Reference:
		fmt.Fprintf(w, "  %s built and stitched in memory (--keep-windows also writes them; re-runs then skip unchanged ones)\n", plural(s.Windows.Count, "window"))
	default:
		fmt.Fprintf(w, "  %s stitched: %d written, %d unchanged since the last run (kept)", plural(s.Windows.Count, "window"), len(s.Windows.Written), len(s.Windows.Kept))
		if !s.Windows.KeptFiles {
			fmt.Fprint(w, "; window files removed (--keep-windows keeps them)")
		}
		fmt.Fprintln(w)
		if len(s.Windows.Kept) > 0 {
			fmt.Fprintf(w, "  unchanged: %s\n", strings.Join(s.Windows.Kept, " "))
		}
	}
	read := "headers only"
	if !s.HeadersOnly {
		read = "config, index and headers, and the tensor data " + map[bool]string{true: "copied", false: "materialised"}[s.Weights == weights.Reference]
	}
	fmt.Fprintf(w, "  in %s; read %s of the checkpoint (%s)\n", (time.Duration(s.Seconds * float64(time.Second))).Round(time.Millisecond), human(s.CheckpointBytesRead, "B"), read)
}

// textOut is where a command's text output goes: nowhere with --json (the
// JSON is the output), stderr with --stats - (stdout holds the stats).
func textOut(c *cli.Context) io.Writer {
	if c.Bool("quiet") {
		return io.Discard
	}
	return reportOut(c)
}

// reportOut is where a report that is the command's whole point (archs,
// inspect, check) goes: as textOut, but --quiet does not silence it.
func reportOut(c *cli.Context) io.Writer {
	switch {
	case c.Bool("json"):
		return io.Discard
	case c.Path("stats") == "-":
		return c.App.ErrWriter
	}
	return c.App.Writer
}

// jsonKey holds a command's --json result when --stats - must join it.
const jsonKey = "json"

// emitJSON prints a command's --json result, or keeps it for writeStats
// to print with the stats when --stats - also asks for stdout.
func emitJSON(c *cli.Context, v any) error {
	if c.Path("stats") == "-" {
		c.App.Metadata[jsonKey] = v
		return nil
	}
	return writeJSON(c.App.Writer, v)
}

// withStats adds "stats" to a result object.
func withStats(v any, stats any) (any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	m["stats"] = stats
	return m, nil
}

// progressOut is where progress of long phases goes: stderr, or nowhere
// with --quiet.
func progressOut(c *cli.Context) io.Writer {
	if c.Bool("quiet") {
		return nil
	}
	return c.App.ErrWriter
}

// note tells the user something that does not stop the command (not with
// --quiet).
func note(c *cli.Context, format string, args ...any) { info(c, "note: "+format, args...) }

// info tells the user what strata found (where the model is, whose MTP
// layout it takes) on stderr, unless --quiet.
func info(c *cli.Context, format string, args ...any) {
	if !c.Bool("quiet") {
		fmt.Fprintf(c.App.ErrWriter, "strata: "+format+"\n", args...)
	}
}

// parseSize reads a byte count: digits, optionally with a decimal (kB,
// MB, GB, TB) or binary (KiB, MiB, GiB, TiB) unit.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	mult, ok := map[string]float64{"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
		"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}[strings.ToLower(unit)]
	v, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || num == "" {
		return 0, fmt.Errorf("give a size such as 5GB, 500MB, 2GiB or a number of bytes")
	}
	if n := v * mult; n >= 1 && n < 1<<62 {
		return int64(n), nil
	}
	return 0, fmt.Errorf("the size must be at least one byte")
}
