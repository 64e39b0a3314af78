package headeronly

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/dtype"
	"github.com/strata-llm/strata/sdk/hf"
)

// decoderShape holds the config.json fields every decoder-only LM here
// shares: embedding, attention projections, head.
type decoderShape struct {
	hidden, layers, heads, kvHeads, headDim, vocab int
	attentionBias, tied                            bool
}

// parseDecoder checks dt and reads the shared fields of configJSON; it
// returns the reader for the architecture's own fields.
func parseDecoder(configJSON []byte, dt string) (decoderShape, *hf.Reader, error) {
	if _, ok := dtype.FromSafetensors(dt); !ok {
		return decoderShape{}, nil, fmt.Errorf("unknown safetensors dtype %q", dt)
	}
	c, err := hf.Parse(configJSON)
	if err != nil {
		return decoderShape{}, nil, err
	}
	r := &hf.Reader{Config: c}
	d := decoderShape{
		hidden: r.Int("hidden_size"), layers: r.Int("num_hidden_layers"),
		heads: r.Int("num_attention_heads"), vocab: r.Int("vocab_size"),
		attentionBias: r.BoolOr("attention_bias", false), tied: r.BoolOr("tie_word_embeddings", false),
	}
	if r.Err != nil {
		return decoderShape{}, nil, r.Err
	}
	if d.hidden <= 0 || d.layers <= 0 || d.heads <= 0 || d.vocab <= 0 {
		return decoderShape{}, nil, fmt.Errorf("config.json: hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be positive")
	}
	// The defaults the configs apply when the fields are absent.
	d.kvHeads = r.IntOr("num_key_value_heads", d.heads)
	d.headDim = r.IntOr("head_dim", d.hidden/d.heads)
	if r.Err != nil {
		return decoderShape{}, nil, r.Err
	}
	if d.kvHeads <= 0 || d.headDim <= 0 {
		return decoderShape{}, nil, fmt.Errorf("config.json: num_key_value_heads (%d) and head_dim (%d) must be positive", d.kvHeads, d.headDim)
	}
	return d, r, nil
}

// tensors lists the checkpoint's tensors in state-dict order: embedding,
// each layer's (under model.layers.<l>.), final norm, and the head unless
// tied (save_pretrained drops a tied head).
func (d decoderShape) tensors(dt string, layer func(l int, prefix string) []Tensor) []Tensor {
	h, v := int64(d.hidden), int64(d.vocab)
	out := []Tensor{{"model.embed_tokens.weight", dt, []int64{v, h}}}
	for l := range d.layers {
		out = append(out, layer(l, fmt.Sprintf("model.layers.%d.", l))...)
	}
	out = append(out, Tensor{"model.norm.weight", dt, []int64{h}})
	if !d.tied {
		out = append(out, Tensor{"lm_head.weight", dt, []int64{v, h}})
	}
	return out
}

// attention lists q, k, v and o projections, each bias after its weight.
func (d decoderShape) attention(prefix, dt string) []Tensor {
	h, q, kv := int64(d.hidden), int64(d.heads*d.headDim), int64(d.kvHeads*d.headDim)
	var out []Tensor
	out = append(out, linear(prefix+"self_attn.q_proj", dt, q, h, d.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.k_proj", dt, kv, h, d.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.v_proj", dt, kv, h, d.attentionBias)...)
	return append(out, linear(prefix+"self_attn.o_proj", dt, h, q, d.attentionBias)...)
}

// norms are a layer's two RMSNorm weights, last in its module order.
func (d decoderShape) norms(prefix, dt string) []Tensor {
	h := int64(d.hidden)
	return []Tensor{{prefix + "input_layernorm.weight", dt, []int64{h}},
		{prefix + "post_attention_layernorm.weight", dt, []int64{h}}}
}

// gatedMLP lists gate, up and down projections of width inter under prefix.
func gatedMLP(prefix, dt string, hidden, inter int64, bias bool) []Tensor {
	var out []Tensor
	out = append(out, linear(prefix+"gate_proj", dt, inter, hidden, bias)...)
	out = append(out, linear(prefix+"up_proj", dt, inter, hidden, bias)...)
	return append(out, linear(prefix+"down_proj", dt, hidden, inter, bias)...)
}

// linear is an nn.Linear's weight [out, in] and, with bias, its bias [out].
func linear(name, dt string, outDim, inDim int64, bias bool) []Tensor {
	out := []Tensor{{name + ".weight", dt, []int64{outDim, inDim}}}
	if bias {
		out = append(out, Tensor{name + ".bias", dt, []int64{outDim}})
	}
	return out
}
