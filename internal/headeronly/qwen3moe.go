package headeronly

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/dtype"
	"github.com/strata-llm/strata/sdk/hf"
)

// qwen3MoeShape holds the config.json fields that decide a Qwen3-MoE
// checkpoint's tensor shapes.
type qwen3MoeShape struct {
	hidden, intermediate, moeIntermediate, layers int
	heads, kvHeads, headDim, vocab, experts       int
	sparseStep                                    int
	mlpOnly                                       []int
	attentionBias, tied                           bool
}

func parseQwen3Moe(configJSON []byte) (qwen3MoeShape, error) {
	c, err := hf.Parse(configJSON)
	if err != nil {
		return qwen3MoeShape{}, err
	}
	r := hf.Reader{Config: c}
	s := qwen3MoeShape{
		hidden: r.Int("hidden_size"), intermediate: r.Int("intermediate_size"),
		moeIntermediate: r.Int("moe_intermediate_size"), layers: r.Int("num_hidden_layers"),
		heads: r.Int("num_attention_heads"), vocab: r.Int("vocab_size"),
		experts:    r.FirstInt("num_experts", "num_local_experts"),
		sparseStep: r.IntOr("decoder_sparse_step", 1), mlpOnly: r.Ints("mlp_only_layers"),
		attentionBias: r.BoolOr("attention_bias", false), tied: r.BoolOr("tie_word_embeddings", false),
	}
	if r.Err != nil {
		return qwen3MoeShape{}, r.Err
	}
	if s.hidden <= 0 || s.layers <= 0 || s.heads <= 0 || s.vocab <= 0 || s.sparseStep <= 0 {
		return qwen3MoeShape{}, fmt.Errorf("config.json: hidden_size, num_hidden_layers, num_attention_heads, vocab_size and decoder_sparse_step must be positive")
	}
	s.kvHeads = r.IntOr("num_key_value_heads", s.heads)
	s.headDim = r.IntOr("head_dim", s.hidden/s.heads)
	return s, r.Err
}

// Qwen3MoeTensors lists the tensors a Qwen3MoeForCausalLM checkpoint of
// configJSON holds, as the Hub releases store them (experts per expert), in
// module order.
func Qwen3MoeTensors(configJSON []byte, dt string) ([]Tensor, error) {
	if _, ok := dtype.FromSafetensors(dt); !ok {
		return nil, fmt.Errorf("unknown safetensors dtype %q", dt)
	}
	s, err := parseQwen3Moe(configJSON)
	if err != nil {
		return nil, err
	}
	return decoderTensors(dt, s.hidden, s.vocab, s.layers, s.tied, func(l int, prefix string) []Tensor {
		return s.layer(l, prefix, dt)
	}), nil
}

// layer lists one Qwen3MoeDecoderLayer's tensors: self_attn (with q/k
// norms), the sparse block (router, then each expert) or a dense MLP, then
// the norms.
func (s qwen3MoeShape) layer(l int, prefix, dt string) []Tensor {
	h, hd := int64(s.hidden), int64(s.headDim)
	q, kv := int64(s.heads*s.headDim), int64(s.kvHeads*s.headDim)
	var out []Tensor
	out = append(out, linear(prefix+"self_attn.q_proj", dt, q, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.k_proj", dt, kv, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.v_proj", dt, kv, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.o_proj", dt, h, q, s.attentionBias)...)
	out = append(out,
		Tensor{prefix + "self_attn.q_norm.weight", dt, []int64{hd}},
		Tensor{prefix + "self_attn.k_norm.weight", dt, []int64{hd}})
	if s.sparse(l) {
		mi := int64(s.moeIntermediate)
		out = append(out, linear(prefix+"mlp.gate", dt, int64(s.experts), h, false)...)
		for e := range s.experts {
			expert := fmt.Sprintf("%smlp.experts.%d.", prefix, e)
			out = append(out, linear(expert+"gate_proj", dt, mi, h, false)...)
			out = append(out, linear(expert+"up_proj", dt, mi, h, false)...)
			out = append(out, linear(expert+"down_proj", dt, h, mi, false)...)
		}
	} else {
		i := int64(s.intermediate)
		out = append(out, linear(prefix+"mlp.gate_proj", dt, i, h, false)...)
		out = append(out, linear(prefix+"mlp.up_proj", dt, i, h, false)...)
		out = append(out, linear(prefix+"mlp.down_proj", dt, h, i, false)...)
	}
	return append(out,
		Tensor{prefix + "input_layernorm.weight", dt, []int64{h}},
		Tensor{prefix + "post_attention_layernorm.weight", dt, []int64{h}})
}

// sparse is transformers' rule for a MoE layer.
func (s qwen3MoeShape) sparse(l int) bool {
	return !slices.Contains(s.mlpOnly, l) && s.experts > 0 && (l+1)%s.sparseStep == 0
}
