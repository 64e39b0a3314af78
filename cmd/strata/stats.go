package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/plugins"
)

// runStats is what --stats writes when a command ends: for benchmarks and
// for users sizing machines. Host and plugins are separate processes, so
// their peaks are reported apart.
type runStats struct {
	Command     string  `json:"command"`
	WallSeconds float64 `json:"wall_seconds"`
	Host        usage   `json:"host"`
	// Children are the processes strata started and waited for (plugins,
	// compilers): CPU summed over them; peak RSS of the largest plugin.
	Children            usage  `json:"children"`
	CheckpointBytesRead *int64 `json:"checkpoint_bytes_read,omitempty"`

	start      time.Time
	registries []*plugins.Registry
}

type usage struct {
	UserSeconds   float64 `json:"user_seconds"`
	SystemSeconds float64 `json:"system_seconds"`
	PeakRSSBytes  int64   `json:"peak_rss_bytes"`
}

const statsKey = "stats"

func statsFlag() cli.Flag {
	return &cli.PathFlag{Name: "stats", Usage: "when the command ends, write its wall time, CPU time and peak RSS (host and plugins apart) and the checkpoint bytes read as JSON to `FILE` (- for stdout; with --json, as its \"stats\")"}
}

// startStats notes the start time if --stats is given.
func startStats(c *cli.Context) {
	if c.Path("stats") != "" {
		c.App.Metadata[statsKey] = &runStats{start: time.Now()}
	}
}

// recordBytesRead notes how much of the checkpoint a command read.
func recordBytesRead(c *cli.Context, n int64) {
	if s, ok := c.App.Metadata[statsKey].(*runStats); ok {
		s.CheckpointBytesRead = &n
	}
}

// recordRegistry keeps the plugins a command started, for their peak RSS.
func recordRegistry(c *cli.Context, reg *plugins.Registry) {
	if s, ok := c.App.Metadata[statsKey].(*runStats); ok {
		s.registries = append(s.registries, reg)
	}
}

// writeStats writes --stats; plugins have been stopped and waited for by now.
func writeStats(c *cli.Context) error {
	s, ok := c.App.Metadata[statsKey].(*runStats)
	if !ok {
		return nil
	}
	s.Command = c.Args().First()
	s.WallSeconds = time.Since(s.start).Seconds()
	s.Host, s.Children = processUsage()
	s.Children.PeakRSSBytes = 0
	for _, reg := range s.registries {
		s.Children.PeakRSSBytes = max(s.Children.PeakRSSBytes, reg.PeakRSS())
	}
	if c.Path("stats") == "-" {
		// stdout: alone, or inside the command's --json object, so that
		// stdout holds one JSON object.
		if v, ok := c.App.Metadata[jsonKey]; ok {
			merged, err := withStats(v, s)
			if err != nil {
				return err
			}
			return writeJSON(c.App.Writer, merged)
		}
		return writeJSON(c.App.Writer, s)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(c.Path("stats"), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("--stats: %w", err)
	}
	return nil
}
