package decoder_test

import (
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/decoder"
)

// An architecture's Defaults fill the fields config.json omits before the
// common fields and the RoPE are derived from them; a field present, null
// included, is config.json's.
func TestArchitectureDefaults(t *testing.T) {
	var loaded *decoder.Model
	p := decoder.Plugin{Name: "toy", Architectures: []decoder.Architecture{{
		ModelType: "toy", Name: "Toy",
		Defaults: map[string]any{"head_dim": 8, "num_key_value_heads": 3, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
			"tie_word_embeddings": true},
		Load: func(m *decoder.Model) error {
			loaded = m
			m.Kind("decoder", "ToyLayer", func(l *decoder.Layer) error { return nil })
			return nil
		},
	}}}
	const sizes = `"model_type": "toy", "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1, "vocab_size": 32`
	m, err := p.LoadConfig([]byte(`{` + sizes + `, "num_attention_heads": 6, "num_key_value_heads": null}`))
	if err != nil {
		t.Fatal(err)
	}
	if m != loaded || m.HeadDim != 8 || m.RoPE.Dim != 8 || m.RoPE.Base != 1e6 || m.Eps != 1e-5 || !m.Tied || m.KVHeads != 6 {
		t.Errorf("head_dim %d, rotary %d, theta %g, eps %g, tied %v, kv heads %d; want 8, 8, 1e6, 1e-5, true, 6 (null: the heads)",
			m.HeadDim, m.RoPE.Dim, m.RoPE.Base, m.Eps, m.Tied, m.KVHeads)
	}
	if !m.Defaulted("head_dim") || m.Defaulted("num_key_value_heads") {
		t.Errorf("Defaulted(head_dim) %v, Defaulted(num_key_value_heads) %v; want true, false", m.Defaulted("head_dim"), m.Defaulted("num_key_value_heads"))
	}
	_, err = p.LoadConfig([]byte(`{` + sizes + `, "num_attention_heads": 4}`))
	want := "num_attention_heads (4) must be a multiple of num_key_value_heads (3) (config.json omits num_key_value_heads: model_type toy's default is 3; set it in config.json to override)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want %q", err, want)
	}
}
