package headeronly

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/dtype"
	"github.com/strata-llm/strata/sdk/hf"
)

// decoderShape holds the config.json fields every decoder-only LM here
// shares, read by the SDK's decoder.ParseCommon (the same reading, with the
// same errors, as the plugins'), and the attention bias most of them have.
type decoderShape struct {
	decoder.Common
	attentionBias bool
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
	d := decoderShape{Common: decoder.ParseCommon(r), attentionBias: r.BoolOr("attention_bias", false)}
	if r.Err != nil {
		return decoderShape{}, nil, r.Err
	}
	return d, r, nil
}

// tensors lists the checkpoint's tensors in state-dict order: embedding,
// each layer's (under model.layers.<l>.), final norm, and the head unless
// tied (save_pretrained drops a tied head).
func (d decoderShape) tensors(dt string, layer func(l int, prefix string) []Tensor) []Tensor {
	h, v := int64(d.Hidden), int64(d.Vocab)
	out := []Tensor{{"model.embed_tokens.weight", dt, []int64{v, h}}}
	for l := range d.Layers {
		out = append(out, layer(l, fmt.Sprintf("model.layers.%d.", l))...)
	}
	out = append(out, Tensor{"model.norm.weight", dt, []int64{h}})
	if !d.Tied {
		out = append(out, Tensor{"lm_head.weight", dt, []int64{v, h}})
	}
	return out
}

// attention lists q, k, v and o projections, each bias after its weight.
func (d decoderShape) attention(prefix, dt string) []Tensor {
	h, q, kv := int64(d.Hidden), int64(d.Heads*d.HeadDim), int64(d.KVHeads*d.HeadDim)
	var out []Tensor
	out = append(out, linear(prefix+"self_attn.q_proj", dt, q, h, d.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.k_proj", dt, kv, h, d.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.v_proj", dt, kv, h, d.attentionBias)...)
	return append(out, linear(prefix+"self_attn.o_proj", dt, h, q, d.attentionBias)...)
}

// norms are a layer's two RMSNorm weights, last in its module order.
func (d decoderShape) norms(prefix, dt string) []Tensor {
	h := int64(d.Hidden)
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
