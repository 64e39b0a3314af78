//go:build unix

package headeronly_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/strata-llm/strata/internal/headeronly"
	"github.com/strata-llm/strata/internal/testbin"
)

// TestQwen35Export exports header-only checkpoints generated from the qwen35
// fixtures' configs, with one MTP layer declared, through strata and the
// qwen35 plugin, whole, layerwise and with layer functions: every key the
// plugin binds is where the generator puts it.
func TestQwen35Export(t *testing.T) {
	if testing.Short() {
		t.Skip("builds strata and a plugin")
	}
	bin := t.TempDir()
	strata, err := testbin.Build(bin, "strata", "./cmd/strata")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testbin.Build(bin, "strata-plugin-qwen35", "./cmd/strata-plugin-qwen35"); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{ // fixture: the field declaring MTP layers
		"qwen35-f32-dense":  "mtp_num_hidden_layers",
		"qwen35moe-bf16":    "mtp_num_hidden_layers",
		"qwen35moe-mm-bf16": "mtp_num_hidden_layers",
		"qwen3next-bf16":    "num_nextn_predict_layers",
	}
	modes := map[string][]string{"whole": nil, "layerwise w1": {"--layerwise", "--window-size", "1"}, "subfunctions": {"--subfunctions"}}
	for fixture, field := range cases {
		t.Run(fixture, func(t *testing.T) {
			ckpt := writeWithMTP(t, fixture, field)
			for name, args := range modes {
				out := filepath.Join(t.TempDir(), "out")
				cmd := exec.Command(strata, append([]string{"export", ckpt, "--out", out}, args...)...)
				if msg, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s: %v\n%s", name, err, msg)
				}
				if _, err := os.Stat(filepath.Join(out, "model.onnx")); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			}
		})
	}
}

// writeWithMTP writes a header-only BF16 checkpoint of the fixture's config
// with field set to 1 (in text_config where there is one).
func writeWithMTP(t *testing.T, fixture, field string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testbin.Root(), "conformance", "fixtures", fixture, "model", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	text := c
	if tc, ok := c["text_config"].(map[string]any); ok {
		text = tc
	}
	text[field] = 1
	config, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	tensors, err := headeronly.Tensors(config, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	if _, err := headeronly.Write(dir, config, tensors, 1<<20); err != nil {
		t.Fatal(err)
	}
	return dir
}
