package convert

import "testing"

// Every key layout a plugin reads a language model under is a layer of
// its own to convert: a layout missed puts its layers in the tail shard.
func TestLayerOf(t *testing.T) {
	for key, want := range map[string]struct {
		layer  int
		prefix string
	}{
		"model.layers.3.mlp.up_proj.weight":                         {3, "model.layers.3"},
		"model.language_model.layers.12.self_attn.q_proj.weight":    {12, "model.language_model.layers.12"},
		"language_model.model.layers.0.input_layernorm.weight":      {0, "language_model.model.layers.0"},
		"language_model.layers.7.mlp.gate.weight":                   {7, "language_model.layers.7"},
		"model.language_model.model.layers.2.mlp.down_proj.weight":  {2, "model.language_model.model.layers.2"},
		"language_model.model.model.layers.5.post_attention.weight": {5, "language_model.model.model.layers.5"},
		"model.embed_tokens.weight":                                 {-1, ""},
		"model.visual.blocks.0.attn.qkv.weight":                     {-1, ""},
		"mtp.layers.0.mlp.up_proj.weight":                           {-1, ""},
		"vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": {-1, ""},
		"model.layers.x.mlp.up_proj.weight":                         {-1, ""},
	} {
		layer, prefix := layerOf(key)
		if layer != want.layer || prefix != want.prefix {
			t.Errorf("layerOf(%s) = %d, %q; want %d, %q", key, layer, prefix, want.layer, want.prefix)
		}
	}
}
