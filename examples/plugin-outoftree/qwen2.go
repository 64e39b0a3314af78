// Command strata-plugin-qwen2 exports Qwen2 checkpoints (model_type qwen2,
// Qwen2ForCausalLM) as transformers' modeling_qwen2.py computes them:
// Llama's decoder with q/k/v biases (no o_proj bias), and, when
// use_sliding_window is set, the layers layer_types marks sliding_attention
// masked to the last sliding_window positions.
//
// It lives outside strata's module and imports only its SDK: the example of
// docs/plugins.md "Building a plugin out of tree".
package main

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
)

func main() { sdk.Serve(plugin) }

var plugin = decoder.Plugin{Name: "qwen2", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "qwen2", HFArchitectures: []string{"Qwen2ForCausalLM"}, Name: "Qwen2", Load: load,
}}}

// load declares a full-attention kind and, when some layer slides, a
// sliding one reading a sliding-window mask.
func load(m *decoder.Model) error {
	decoder.RequireSiLU(m.Reader, "qwen2")
	if m.RoPE.Dim != m.HeadDim {
		return fmt.Errorf("config.json: partial_rotary_factor (rotary dimension %d of head_dim %d) is not supported by the qwen2 plugin: transformers' Qwen2 rotates the whole head", m.RoPE.Dim, m.HeadDim)
	}
	types, window, err := layerTypes(m)
	if err != nil {
		return err
	}
	kind := func(mask string) func(l *decoder.Layer) error {
		return func(l *decoder.Layer) error {
			return l.PreNorm(&decoder.Attention{QKVBias: true, Mask: mask}, &decoder.SwiGLU{Width: m.Intermediate})
		}
	}
	m.Kind("full_attention", "Qwen2DecoderLayer", kind(""))
	if slices.Contains(types, "sliding_attention") {
		m.AddContext(decoder.SlidingWindow("sliding_mask", window))
		m.Kind("sliding_attention", "Qwen2SlidingDecoderLayer", kind("sliding_mask"))
		m.KindOf = func(i int) string { return types[i] }
		m.Note("layers marked sliding_attention are masked to the last %d positions", window)
	}
	return nil
}

// layerTypes reads each layer's attention as Qwen2Config does: layer_types
// when given, else sliding from max_window_layers (default 28) on; the
// window is sliding_window (default 4096), 0 unless use_sliding_window.
func layerTypes(m *decoder.Model) (types []string, window int, err error) {
	switch {
	case !m.BoolOr("use_sliding_window", false):
	case !slices.Contains(m.Config.Keys(), "sliding_window"):
		window = 4096
	case m.Config.Has("sliding_window"): // null: no window
		if window = m.Int("sliding_window"); window < 1 && m.Err == nil {
			return nil, 0, fmt.Errorf("config.json: sliding_window must be positive (or null for none), got %d", window)
		}
	}
	types = m.Strings("layer_types")
	if m.Err != nil {
		return nil, 0, m.Err
	}
	if types == nil {
		first := m.IntOr("max_window_layers", 28)
		for i := range m.Layers {
			types = append(types, map[bool]string{true: "sliding_attention", false: "full_attention"}[window > 0 && i >= first])
		}
	}
	if len(types) != m.Layers {
		return nil, 0, fmt.Errorf("config.json: layer_types has %d entries for %d layers", len(types), m.Layers)
	}
	for i, t := range types {
		switch {
		case t == "sliding_attention" && window == 0:
			return nil, 0, fmt.Errorf("config.json: layer_types[%d] is sliding_attention but there is no window (use_sliding_window is false or sliding_window null)", i)
		case t != "sliding_attention" && t != "full_attention":
			return nil, 0, fmt.Errorf("config.json: layer_types[%d] is %q; Qwen2 layers are full_attention or sliding_attention", i, t)
		}
	}
	return types, window, m.Err
}
