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
	if _, err := testbin.Build(bin, "strata-plugin-llama", "./cmd/strata-plugin-llama"); err != nil {
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

	// A quantised release (fine-grained FP8) limited to one mode.
	configs := t.TempDir()
	writeRelease(t, configs, "tiny-fp8", `{"model_type": "llama", "architectures": ["LlamaForCausalLM"],
		"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "vocab_size": 128, "quantization_config": {"quant_method": "fp8",
		"activation_scheme": "dynamic", "weight_block_size": [32, 32], "modules_to_not_convert": ["lm_head"]}}`,
		`{"max_shard_bytes": 5000000000, "shards": 1, "modes": ["whole"]}`)
	out.Reset()
	if err := run([]string{"--strata", strata, "--configs", configs, "--scaling", "", "--runs", "1", "--json", jsonPath}, &out); err != nil {
		t.Fatal(err)
	}
	res = results{}
	if data, err = os.ReadFile(jsonPath); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Releases) != 1 || res.Releases[0].Mode != "whole" || res.Releases[0].BytesRead != res.Releases[0].HeaderBytes {
		t.Errorf("rows %+v:\n%s", res.Releases, out.String())
	}
}

func writeRelease(t *testing.T, configs, name, config, release string) {
	t.Helper()
	dir := filepath.Join(configs, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for file, data := range map[string]string{"config.json": config, "release.json": release} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBenchRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{{"--runs", "0"}, {"--strata", "/nonexistent/strata"}} {
		if err := run(args, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
