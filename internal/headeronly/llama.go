package headeronly

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/dtype"
	"github.com/strata-llm/strata/sdk/hf"
)

// llamaShape holds the config.json fields that decide a Llama checkpoint's
// tensor shapes.
type llamaShape struct {
	hidden, intermediate, layers, heads, kvHeads, headDim, vocab int
	attentionBias, mlpBias, tied                                 bool
}

func parseLlama(configJSON []byte) (llamaShape, error) {
	c, err := hf.Parse(configJSON)
	if err != nil {
		return llamaShape{}, err
	}
	r := hf.Reader{Config: c}
	s := llamaShape{
		hidden:        r.Int("hidden_size"),
		intermediate:  r.Int("intermediate_size"),
		layers:        r.Int("num_hidden_layers"),
		heads:         r.Int("num_attention_heads"),
		vocab:         r.Int("vocab_size"),
		attentionBias: r.BoolOr("attention_bias", false),
		mlpBias:       r.BoolOr("mlp_bias", false),
		tied:          r.BoolOr("tie_word_embeddings", false),
	}
	if r.Err != nil {
		return llamaShape{}, r.Err
	}
	if s.hidden <= 0 || s.intermediate <= 0 || s.layers <= 0 || s.heads <= 0 || s.vocab <= 0 {
		return llamaShape{}, fmt.Errorf("config.json: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and vocab_size must be positive")
	}
	// The defaults LlamaConfig applies when the fields are absent.
	s.kvHeads = r.IntOr("num_key_value_heads", s.heads)
	s.headDim = r.IntOr("head_dim", s.hidden/s.heads)
	if r.Err != nil {
		return llamaShape{}, r.Err
	}
	if s.kvHeads <= 0 || s.headDim <= 0 {
		return llamaShape{}, fmt.Errorf("config.json: num_key_value_heads (%d) and head_dim (%d) must be positive", s.kvHeads, s.headDim)
	}
	return s, nil
}

// LlamaTensors lists the tensors a LlamaForCausalLM checkpoint of
// configJSON holds, all of safetensors dtype dt, in the order save_pretrained
// writes its state dict (which decides the shard split).
func LlamaTensors(configJSON []byte, dt string) ([]Tensor, error) {
	if _, ok := dtype.FromSafetensors(dt); !ok {
		return nil, fmt.Errorf("unknown safetensors dtype %q", dt)
	}
	s, err := parseLlama(configJSON)
	if err != nil {
		return nil, err
	}
	return decoderTensors(dt, s.hidden, s.vocab, s.layers, s.tied, func(l int, prefix string) []Tensor {
		return s.layer(prefix, dt)
	}), nil
}

// decoderTensors lists a decoder-only LM's tensors in state-dict order:
// embedding, each layer's (under model.layers.<l>.), final norm, and the
// head unless tied (save_pretrained drops a tied head).
func decoderTensors(dt string, hidden, vocab, layers int, tied bool, layer func(l int, prefix string) []Tensor) []Tensor {
	h, v := int64(hidden), int64(vocab)
	out := []Tensor{{"model.embed_tokens.weight", dt, []int64{v, h}}}
	for l := range layers {
		out = append(out, layer(l, fmt.Sprintf("model.layers.%d.", l))...)
	}
	out = append(out, Tensor{"model.norm.weight", dt, []int64{h}})
	if !tied {
		out = append(out, Tensor{"lm_head.weight", dt, []int64{v, h}})
	}
	return out
}

// layer lists one decoder layer's tensors in LlamaDecoderLayer's module
// order (self_attn, mlp, then the norms), each bias after its weight.
func (s llamaShape) layer(prefix, dt string) []Tensor {
	h, i := int64(s.hidden), int64(s.intermediate)
	q, kv := int64(s.heads*s.headDim), int64(s.kvHeads*s.headDim)
	var out []Tensor
	out = append(out, linear(prefix+"self_attn.q_proj", dt, q, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.k_proj", dt, kv, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.v_proj", dt, kv, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.o_proj", dt, h, q, s.attentionBias)...)
	out = append(out, linear(prefix+"mlp.gate_proj", dt, i, h, s.mlpBias)...)
	out = append(out, linear(prefix+"mlp.up_proj", dt, i, h, s.mlpBias)...)
	out = append(out, linear(prefix+"mlp.down_proj", dt, h, i, s.mlpBias)...)
	return append(out,
		Tensor{prefix + "input_layernorm.weight", dt, []int64{h}},
		Tensor{prefix + "post_attention_layernorm.weight", dt, []int64{h}})
}

// linear is an nn.Linear's weight [out, in] and, with bias, its bias [out].
func linear(name, dt string, outDim, inDim int64, bias bool) []Tensor {
	out := []Tensor{{name + ".weight", dt, []int64{outDim, inDim}}}
	if bias {
		out = append(out, Tensor{name + ".bias", dt, []int64{outDim}})
	}
	return out
}
