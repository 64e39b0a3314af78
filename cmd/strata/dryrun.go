package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/convert"
	"github.com/strata-llm/strata/host/export"
	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/weights"
)

// dryRunNote heads every dry-run report.
const dryRunNote = "dry run: nothing was written, and --out was not created"

// exportPlan is export --dry-run's report: what a real run would write
// and read (the text report and --json carry the same facts).
type exportPlan struct {
	Command string `json:"command"`
	DryRun  bool   `json:"dry_run"`
	exportFacts
	Files   []plannedFile `json:"files"` // bytes null: known when written
	Inputs  []plannedIO   `json:"inputs"`
	Outputs []plannedIO   `json:"outputs"`
	Windows []string      `json:"windows,omitempty"`
	// CheckpointBytesRead is what planning read (config, index, headers);
	// ShardBytesRead what a real run would read more (copies, materialising).
	CheckpointBytesRead int64    `json:"checkpoint_bytes_read"`
	ShardBytesRead      int64    `json:"shard_bytes_read"`
	Notes               []string `json:"notes,omitempty"`
}

type plannedIO struct {
	Name  string   `json:"name"`
	DType string   `json:"dtype"`
	Shape []string `json:"shape"`
}

func planExport(p *plugins.Plugin, ckpt *checkpoint.Checkpoint, loc checkpoint.Location, opts export.Options, res *export.Result) *exportPlan {
	pl := res.Planned
	s := &exportPlan{Command: "export", DryRun: true, exportFacts: factsOf(p, ckpt, loc, opts, res), Windows: pl.Windows,
		CheckpointBytesRead: ckpt.BytesRead, Notes: res.Notes, Files: []plannedFile{}}
	s.Link = pl.Link
	for _, f := range pl.Files {
		s.Files = append(s.Files, newPlannedFile(opts.Out, f.Path, f.Bytes, f.What))
		if f.What == "checkpoint" && (s.Weights == weights.Materialize || s.Link == weights.LinkCopy) {
			s.ShardBytesRead += f.Bytes
		}
	}
	for _, v := range pl.Inputs {
		s.Inputs = append(s.Inputs, plannedIO(v))
	}
	for _, v := range pl.Outputs {
		s.Outputs = append(s.Outputs, plannedIO(v))
	}
	return s
}

func (s *exportPlan) print(w io.Writer) {
	fmt.Fprintf(w, "%s\nexport of %s with plugin %s %s would write: %d layers, %s parameters, compute %s, weights %s\n",
		dryRunNote, s.ModelType, s.Plugin.Name, s.Plugin.Version, s.Layers, human(s.Parameters, ""), s.ComputeDType, s.Weights)
	for _, f := range s.Files {
		switch f.What {
		case "window", "manifest":
			fmt.Fprintf(w, "  %s (%s, %s)\n", f.Path, f.What, f.size())
		case "checkpoint":
			how := "--link " + s.Link
			if s.Link == weights.LinkAuto {
				how = "--link auto: a reflink where the file system can, else a hard link"
			}
			fmt.Fprintf(w, "  %s (the checkpoint's %s shard, %s)\n", f.Path, f.size(), how)
		case "weights":
			fmt.Fprintf(w, "  %s (%s of materialised weights, and their safetensors headers)\n", f.Path, f.size())
		default:
			fmt.Fprintf(w, "  %s (%s)\n", f.Path, f.size())
		}
	}
	if len(s.Windows) > 0 {
		fmt.Fprintf(w, "  %s: %s (sizes above are the whole graph's; the stitched model.onnx matches it within a few bytes)\n", plural(len(s.Windows), "window"), strings.Join(s.Windows, " "))
	}
	for _, io := range []struct {
		what string
		vs   []plannedIO
	}{{"inputs", s.Inputs}, {"outputs", s.Outputs}} {
		fmt.Fprintf(w, "  model.onnx %s:\n", io.what)
		for _, v := range io.vs {
			fmt.Fprintf(w, "    %-28s %s [%s]\n", v.Name, v.DType, strings.Join(v.Shape, ", "))
		}
	}
	fmt.Fprintf(w, "  read %s of the checkpoint to plan (config, index, headers); a real run reads %s more\n",
		human(s.CheckpointBytesRead, "B"), human(s.ShardBytesRead, "B"))
	for _, n := range s.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

// convertPlan is convert --dry-run's report.
type convertPlan struct {
	Command  string `json:"command"`
	DryRun   bool   `json:"dry_run"`
	Out      string `json:"out"`
	DType    string `json:"dtype,omitempty"`
	Quantize string `json:"quantize,omitempty"`
	Layers   int    `json:"layers"`
	// Files: bytes null for what finalize writes, known only then.
	Files           []plannedFile `json:"files"`
	SourceBytesRead int64         `json:"source_bytes_read"`
}

// plannedFile is a file a dry run foretells; Bytes nil: its size is known
// only when it is written.
type plannedFile struct {
	Path  string `json:"path"`
	Bytes *int64 `json:"bytes"`
	What  string `json:"what"`
}

func newPlannedFile(out, rel string, bytes int64, what string) plannedFile {
	f := plannedFile{Path: filepath.Join(out, filepath.FromSlash(rel)), What: what}
	if bytes >= 0 {
		f.Bytes = &bytes
	}
	return f
}

func (f plannedFile) size() string {
	if f.Bytes == nil {
		return "size known when written"
	}
	return human(*f.Bytes, "B")
}

func planConvert(res *convert.Result, opts convert.Options) convertPlan {
	s := convertPlan{Command: "convert", DryRun: true, Out: res.Out, DType: opts.DType, Quantize: opts.Quantize,
		Layers: res.Layers, Files: []plannedFile{}, SourceBytesRead: res.ReadBytes}
	for _, f := range res.Planned {
		s.Files = append(s.Files, newPlannedFile(res.Out, f.Path, f.Bytes, f.What))
	}
	return s
}

func (s convertPlan) print(w io.Writer) {
	fmt.Fprintf(w, "%s\nconvert would write (as into a new directory; layers already converted there are kept):\n", dryRunNote)
	for _, f := range s.Files {
		fmt.Fprintf(w, "  %s (%s, %s)\n", f.Path, f.What, f.size())
	}
	fmt.Fprintf(w, "  reading %s of the source's tensor data\n", human(s.SourceBytesRead, "B"))
	var need int64
	for _, f := range s.Files {
		if f.Bytes != nil {
			need += *f.Bytes
		}
	}
	if free, err := outdir.AvailableAt(s.Out); err == nil && need > free {
		fmt.Fprintf(w, "  note: the files above (%s) do not fit in the %s free on the file system of %s: a real run refuses, unless layers already converted there make up the difference\n", human(need, "B"), human(free, "B"), s.Out)
	}
}
