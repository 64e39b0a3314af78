package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
)

// The bench runs end to end on the smallest release, with the scaling
// series cut to what fits a test, and reports headers-only reads.
func TestBenchRuns(t *testing.T) {
	bin := t.TempDir()
	strata, err := testbin.Build(bin, "strata", "./cmd/strata")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testbin.Build(bin, "strata-plugin-llama", "./plugins/llama"); err != nil {
		t.Fatal(err)
	}
	jsonPath := filepath.Join(t.TempDir(), "results.json")
	var out strings.Builder
	err = run([]string{"--strata", strata, "--configs", filepath.Join(testbin.Root(), "bench", "configs"),
		"--only", "llama-3.1-8b", "--runs", "1", "--json", jsonPath}, &out)
	if err != nil {
		t.Fatal(err)
	}
	var res results
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Releases) != len(modes) || len(res.Scaling) != 6 {
		t.Fatalf("%d release rows, %d scaling rows:\n%s", len(res.Releases), len(res.Scaling), out.String())
	}
	for _, x := range res.Releases {
		if x.Layers != 32 || x.Shards != 4 || x.BytesRead != x.HeaderBytes || x.WallSeconds <= 0 || x.ModelBytes <= 0 {
			t.Errorf("row %+v", x)
		}
	}
	if !strings.Contains(out.String(), "| llama-3.1-8b | whole | 32 | 4 |") {
		t.Errorf("table:\n%s", out.String())
	}
}

func TestBenchRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{{"--runs", "0"}, {"--strata", "/nonexistent/strata"}} {
		if err := run(args, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
