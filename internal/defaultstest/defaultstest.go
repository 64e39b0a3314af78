// Package defaultstest checks an in-tree plugin's Architecture.Defaults
// against transformers: testdata/transformers_defaults.json holds, per
// model_type, a config.json that omits every field a size does not need
// and the values transformers' configuration class gives the fields the
// export derives from (testdata/gen_defaults.py reads them back from the
// classes).
package defaultstest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/decoder"
)

type arch struct {
	Config json.RawMessage `json:"config"`
	Want   map[string]any  `json:"want"`
}

// Check loads modelType's minimal config with plugin and compares what the
// export reads with transformers' values: the common fields, the RoPE base
// (and for "rope.original_max_position_embeddings" the RoPE's), and for
// "config.<key>" the field as the plugin's Load sees it.
func Check(t *testing.T, plugin decoder.Plugin, modelType string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "testdata", "transformers_defaults.json"))
	if err != nil {
		t.Fatal(err)
	}
	var all struct {
		Archs map[string]json.RawMessage `json:"archs"`
	}
	if err := json.Unmarshal(data, &all); err != nil {
		t.Fatal(err)
	}
	var a arch
	if err := json.Unmarshal(all.Archs[modelType], &a); err != nil || len(a.Want) == 0 {
		t.Fatalf("transformers_defaults.json has no %s (%v): run testdata/gen_defaults.py", modelType, err)
	}
	m, err := plugin.LoadConfig(a.Config)
	if err != nil {
		t.Fatalf("%s: %v", a.Config, err)
	}
	got := map[string]any{"rms_norm_eps": m.Eps, "num_key_value_heads": float64(m.KVHeads), "head_dim": float64(m.HeadDim),
		"tie_word_embeddings": m.Tied, "rope_theta": m.RoPE.Base, "rope.original_max_position_embeddings": m.RoPE.OriginalMaxPositions}
	for key, want := range a.Want {
		t.Run(key, func(t *testing.T) {
			g, ok := got[key]
			var err error
			if field, isConfig := strings.CutPrefix(key, "config."); isConfig {
				g, err = m.Config.Float(field)
				ok = err == nil
			}
			if !ok || g != want {
				t.Errorf("%s, the field omitted: %s is %v (%v); transformers' default is %v", modelType, key, g, err, want)
			}
		})
	}
}
