package headeronly

import (
	"fmt"
	"slices"
)

// qwen3MoeShape holds the config.json fields that decide a Qwen3-MoE
// checkpoint's tensor shapes.
type qwen3MoeShape struct {
	decoderShape
	intermediate, moeIntermediate, experts, sparseStep int
	mlpOnly                                            []int
}

// Qwen3MoeTensors lists the tensors a Qwen3MoeForCausalLM checkpoint of
// configJSON holds, as the Hub releases store them (experts per expert), in
// module order.
func Qwen3MoeTensors(configJSON []byte, dt string) ([]Tensor, error) {
	d, r, err := parseDecoder(configJSON, dt)
	if err != nil {
		return nil, err
	}
	s := qwen3MoeShape{decoderShape: d,
		intermediate: r.Int("intermediate_size"), moeIntermediate: r.Int("moe_intermediate_size"),
		experts:    r.FirstInt("num_experts", "num_local_experts"),
		sparseStep: r.IntOr("decoder_sparse_step", 1), mlpOnly: r.Ints("mlp_only_layers"),
	}
	if r.Err != nil {
		return nil, r.Err
	}
	if s.sparseStep <= 0 {
		return nil, fmt.Errorf("config.json: decoder_sparse_step must be positive, got %d", s.sparseStep)
	}
	return s.tensors(dt, func(l int, prefix string) []Tensor { return s.layer(l, prefix, dt) }), nil
}

// layer lists one Qwen3MoeDecoderLayer's tensors: self_attn (with q/k
// norms), the sparse block (router, then each expert) or a dense MLP, then
// the norms.
func (s qwen3MoeShape) layer(l int, prefix, dt string) []Tensor {
	h, hd := int64(s.Hidden), int64(s.HeadDim)
	out := append(s.attention(prefix, dt),
		Tensor{prefix + "self_attn.q_norm.weight", dt, []int64{hd}},
		Tensor{prefix + "self_attn.k_norm.weight", dt, []int64{hd}})
	if s.sparse(l) {
		out = append(out, linear(prefix+"mlp.gate", dt, int64(s.experts), h, false)...)
		for e := range s.experts {
			out = append(out, gatedMLP(fmt.Sprintf("%smlp.experts.%d.", prefix, e), dt, h, int64(s.moeIntermediate), false)...)
		}
	} else {
		out = append(out, gatedMLP(prefix+"mlp.", dt, h, int64(s.intermediate), false)...)
	}
	return append(out, s.norms(prefix, dt)...)
}

// sparse is transformers' rule for a MoE layer.
func (s qwen3MoeShape) sparse(l int) bool {
	return !slices.Contains(s.mlpOnly, l) && s.experts > 0 && (l+1)%s.sparseStep == 0
}
