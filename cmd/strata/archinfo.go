package main

import (
	"encoding/json"
	"fmt"
	"strings"
)

// archNumbers are an architecture's key numbers, read from config.json
// generically (the keys transformers' configs use, a language model's under
// text_config when there is one): no plugin is needed to read them.
type archNumbers struct {
	HiddenSize          int64    `json:"hidden_size,omitempty"`
	IntermediateSize    int64    `json:"intermediate_size,omitempty"`
	Layers              int64    `json:"num_hidden_layers,omitempty"`
	Heads               int64    `json:"num_attention_heads,omitempty"`
	KVHeads             int64    `json:"num_key_value_heads,omitempty"`
	HeadDim             int64    `json:"head_dim,omitempty"`
	VocabSize           int64    `json:"vocab_size,omitempty"`
	ContextLength       int64    `json:"max_position_embeddings,omitempty"`
	SlidingWindow       int64    `json:"sliding_window,omitempty"`
	RoPEType            string   `json:"rope_type,omitempty"`
	RoPETheta           *float64 `json:"rope_theta,omitempty"`
	Experts             int64    `json:"experts,omitempty"`
	ExpertsPerToken     int64    `json:"experts_per_token,omitempty"`
	SharedExperts       int64    `json:"shared_experts,omitempty"`
	MoEIntermediateSize int64    `json:"moe_intermediate_size,omitempty"`
	MTPLayers           int64    `json:"mtp_layers,omitempty"`
	TiedEmbeddings      bool     `json:"tie_word_embeddings,omitempty"`
	DType               string   `json:"dtype,omitempty"`
	// TextConfig says the numbers come from config.json's text_config.
	TextConfig bool `json:"text_config,omitempty"`
}

// readArchNumbers reads the key numbers of config.json; keys it lacks stay
// zero. Unreadable JSON gives none (opening the checkpoint checked it).
func readArchNumbers(config []byte) archNumbers {
	var top map[string]any
	if json.Unmarshal(config, &top) != nil {
		return archNumbers{}
	}
	cfg := top
	var a archNumbers
	if text, ok := top["text_config"].(map[string]any); ok {
		cfg, a.TextConfig = map[string]any{}, true
		for k, v := range top {
			cfg[k] = v
		}
		for k, v := range text {
			cfg[k] = v
		}
	}
	num := func(keys ...string) int64 {
		for _, k := range keys {
			if f, ok := cfg[k].(float64); ok {
				return int64(f)
			}
		}
		return 0
	}
	str := func(m map[string]any, keys ...string) string {
		for _, k := range keys {
			if s, ok := m[k].(string); ok && s != "" {
				return s
			}
		}
		return ""
	}
	a.HiddenSize = num("hidden_size", "n_embd", "d_model")
	a.IntermediateSize = num("intermediate_size", "ffn_hidden_size", "n_inner")
	a.Layers = num("num_hidden_layers", "n_layer", "num_layers")
	a.Heads = num("num_attention_heads", "n_head")
	a.KVHeads = num("num_key_value_heads", "num_kv_heads", "n_head_kv")
	if a.KVHeads == 0 {
		a.KVHeads = a.Heads
	}
	a.HeadDim = num("head_dim")
	if a.HeadDim == 0 && a.Heads > 0 {
		a.HeadDim = a.HiddenSize / a.Heads
	}
	a.VocabSize = num("vocab_size")
	a.ContextLength = num("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length")
	if f, ok := cfg["use_sliding_window"].(bool); !ok || f {
		a.SlidingWindow = num("sliding_window")
	}
	rope, _ := cfg["rope_parameters"].(map[string]any)
	if rope == nil {
		rope, _ = cfg["rope_scaling"].(map[string]any)
	}
	a.RoPEType = str(rope, "rope_type", "type")
	theta, ok := cfg["rope_theta"].(float64)
	if !ok && rope != nil {
		theta, ok = rope["rope_theta"].(float64)
	}
	if ok {
		a.RoPETheta = &theta
		if a.RoPEType == "" {
			a.RoPEType = "default"
		}
	}
	a.Experts = num("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
	if a.Experts > 0 {
		a.ExpertsPerToken = num("num_experts_per_tok", "moe_topk", "top_k", "experts_per_token")
		a.SharedExperts = num("n_shared_experts", "num_shared_experts")
		a.MoEIntermediateSize = num("moe_intermediate_size")
	}
	a.MTPLayers = num("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")
	a.TiedEmbeddings, _ = cfg["tie_word_embeddings"].(bool)
	a.DType = str(cfg, "dtype", "torch_dtype")
	return a
}

// print writes the numbers as inspect's text rows.
func (a archNumbers) print(row func(k, v string)) {
	if a.HiddenSize > 0 {
		v := fmt.Sprint(a.HiddenSize)
		if a.IntermediateSize > 0 {
			v += fmt.Sprintf(" (intermediate %d)", a.IntermediateSize)
		}
		if a.TextConfig {
			v += " (text_config)"
		}
		row("hidden", v)
	}
	if a.Heads > 0 {
		row("attention", fmt.Sprintf("%d heads, %d KV heads, head_dim %d", a.Heads, a.KVHeads, a.HeadDim))
	}
	if a.VocabSize > 0 {
		v := fmt.Sprint(a.VocabSize)
		if a.TiedEmbeddings {
			v += " (tied embeddings)"
		}
		row("vocab", v)
	}
	if a.ContextLength > 0 {
		v := fmt.Sprint(a.ContextLength)
		if a.SlidingWindow > 0 {
			v += fmt.Sprintf(" (sliding window %d)", a.SlidingWindow)
		}
		row("context", v)
	}
	if a.RoPEType != "" {
		v := a.RoPEType
		if a.RoPETheta != nil {
			v += fmt.Sprintf(", theta %g", *a.RoPETheta)
		}
		row("rope", v)
	}
	if a.Experts > 0 {
		parts := []string{fmt.Sprintf("%d", a.Experts)}
		if a.ExpertsPerToken > 0 {
			parts = append(parts, fmt.Sprintf("top-%d", a.ExpertsPerToken))
		}
		if a.SharedExperts > 0 {
			parts = append(parts, fmt.Sprintf("%d shared", a.SharedExperts))
		}
		if a.MoEIntermediateSize > 0 {
			parts = append(parts, fmt.Sprintf("intermediate %d", a.MoEIntermediateSize))
		}
		row("experts", strings.Join(parts, ", "))
	}
	if a.MTPLayers > 0 {
		row("mtp", plural(int(a.MTPLayers), "layer"))
	}
}
