package convert

import (
	"os"
	"path/filepath"
	"slices"

	"github.com/strata-llm/strata/host/checkpoint"
)

// PlannedFile is a file a conversion would write (Options.DryRun).
type PlannedFile struct {
	Path  string // relative to the output directory
	Bytes int64
	What  string // layer, tail, config, index, report, sidecar
}

// dryRun is what Convert would write for todo (the tail as layer -1) and
// read of the source, into a new directory, from the plan alone: the
// shards' sizes are their layouts', which writing reproduces byte for byte.
func (p *plan) dryRun(res *Result, todo []int, finalize bool) error {
	if finalize && len(p.byLayer[-1]) > 0 && !slices.Contains(todo, -1) {
		todo = append(todo, -1) // finalize writes the tail
	}
	for _, l := range todo {
		var entries []checkpoint.Entry
		for _, g := range p.byLayer[l] {
			entries = append(entries, g.Outputs...)
			for _, s := range []*source{g.src, g.scale} {
				if s != nil {
					res.ReadBytes += s.Length
				}
			}
		}
		shard, err := expectedShard(shardName(l), entries)
		if err != nil {
			return err
		}
		what := "layer"
		if l < 0 {
			what = "tail"
		}
		res.Planned = append(res.Planned, PlannedFile{Path: shard.File, Bytes: shard.Size, What: what})
	}
	if !finalize {
		return nil
	}
	// Sizes of what finalize writes are known only then (the report and
	// index hold every shard's accounting).
	res.Planned = append(res.Planned, PlannedFile{Path: "config.json", Bytes: -1, What: "config"},
		PlannedFile{Path: IndexFile, Bytes: -1, What: "index"}, PlannedFile{Path: ReportFile, Bytes: -1, What: "report"})
	entries, err := os.ReadDir(p.inv.dir)
	if err != nil {
		return err
	}
	o := &outDir{p: p}
	for _, e := range entries {
		if o.skipSidecar(e.Name()) {
			continue
		}
		if path, err := regularFile(filepath.Join(p.inv.dir, e.Name())); err == nil {
			if info, err := os.Stat(path); err == nil {
				res.Planned = append(res.Planned, PlannedFile{Path: e.Name(), Bytes: info.Size(), What: "sidecar"})
			}
		}
	}
	return nil
}
