package export

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
)

// TestMistakenPluginFailsExport runs `strata export` of the tiny Llama with
// the fake plugin's modes that return a layer part with one mistake: each
// must fail with exit status 1 and an error naming the plugin, the part (or
// layer) and the value, before anything is written.
func TestMistakenPluginFailsExport(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"weight-name": `strata: error: plugin fake-weight-name: part layer kind "decoder": node "self_attn/q_proj/Gemm" (Gemm) reads "model.layers.0.self_attn.q_proj.weight", ` +
			`which nothing in the function defines (inputs: hidden_states, position_ids, past_key, past_value, cos, sin, mask, cache_read_indices, cache_read_invalid, ` +
			`input_layernorm.weight, self_attn.q_proj.weight, self_attn.k_proj.weight, and 6 more; did you mean self_attn.q_proj.weight?)`,
		"context-typo": `strata: error: plugin fake-context-typo: part layer kind "decoder": input "msk" is bound to nothing: no weight binding names it and the host does not pass it ` +
			`(it passes the inputs hidden_states, position_ids; the caches past_key, past_value; the context values cos, sin, mask, cache_read_indices, cache_read_invalid); did you mean mask?`,
		"no-cache-output": `strata: error: plugin fake-no-cache-output: part layer kind "decoder": the kind declares cache "past_value", ` +
			`but the function has no output "past_value_RetainedState", its retained state (outputs: hidden_states_out, past_key_RetainedState)`,
		// Found by the goroutine preparing the next layer's bindings while one is placed.
		"missing-tensor": `strata: error: assembling layers 0-1 from plugin fake-missing-tensor: layers.1: input self_attn.q_proj.weight: ` +
			`tensor model.layers.1.self_attn.q_proj.weight.missing is bound by the plugin but missing from the checkpoint`,
	}
	dir := t.TempDir()
	strata, err := testbin.Build(dir, "strata", "./cmd/strata")
	if err != nil {
		t.Fatal(err)
	}
	var modes []string
	for m := range cases {
		modes = append(modes, m)
	}
	fakes, err := testbin.FakePlugins(filepath.Join(dir, "fakes"), modes...)
	if err != nil {
		t.Fatal(err)
	}
	tinyLlama := filepath.Join(testbin.Root(), "examples", "tiny-llama", "model")
	for mode, want := range cases {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			out := filepath.Join(t.TempDir(), "out")
			cmd := exec.Command(strata, "export", tinyLlama, "--out", out, "--plugin-dir", fakes[mode])
			// Only the fake plugin: no configured plugin directories.
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "STRATA_PLUGIN_PATH=") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, "XDG_CONFIG_HOME="+t.TempDir())
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("exit %v, want status 1:\n%s", err, stderr.String())
			}
			if got := strings.TrimSpace(stderr.String()); got != want {
				t.Errorf("error\n  %s\nwant\n  %s", got, want)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("the export wrote %s (%v)", out, err)
			}
		})
	}
}
