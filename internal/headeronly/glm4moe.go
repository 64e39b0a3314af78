package headeronly

import "fmt"

// glm4MoeShape holds the config.json fields that decide a glm4_moe
// checkpoint's tensor shapes.
type glm4MoeShape struct {
	decoderShape
	intermediate, moeIntermediate, experts, shared, firstDense, mtp int
	qkNorm                                                          bool
}

// Glm4MoeTensors lists the tensors a Glm4MoeForCausalLM checkpoint of
// configJSON holds as the GLM-4.5/4.6/4.7 releases store them: q/k/v
// biases (o_proj none) when attention_bias, q/k norms when use_qk_norm,
// dense layers below first_k_dense_replace, then MoE layers (router weight,
// F32 e_score_correction_bias, per-expert keys, shared experts), and the
// num_nextn_predict_layers MTP layers inlined as model.layers.{N}, N from
// num_hidden_layers: a MoE decoder layer plus enorm, hnorm, eh_proj and
// shared_head.norm (no embed_tokens or shared_head.head of their own, as
// GLM-4.6 ships them).
func Glm4MoeTensors(configJSON []byte, dt string) ([]Tensor, error) {
	d, r, err := parseDecoder(configJSON, dt)
	if err != nil {
		return nil, err
	}
	s := glm4MoeShape{decoderShape: d,
		intermediate: r.Int("intermediate_size"), moeIntermediate: r.Int("moe_intermediate_size"),
		experts: r.FirstInt("n_routed_experts", "num_local_experts"), shared: r.IntOr("n_shared_experts", 1),
		firstDense: r.IntOr("first_k_dense_replace", 1), mtp: r.IntOr("num_nextn_predict_layers", 0),
		qkNorm: r.BoolOr("use_qk_norm", false),
	}
	if r.Err != nil {
		return nil, r.Err
	}
	if s.intermediate <= 0 || s.moeIntermediate <= 0 || s.experts <= 0 || s.shared < 0 || s.mtp < 0 {
		return nil, fmt.Errorf("config.json: intermediate_size, moe_intermediate_size, n_routed_experts must be positive, n_shared_experts and num_nextn_predict_layers ≥ 0")
	}
	out := s.tensors(dt, func(l int, prefix string) []Tensor { return s.layer(l, prefix, dt) })
	h := int64(s.Hidden)
	for l := s.Layers; l < s.Layers+s.mtp; l++ {
		prefix := fmt.Sprintf("model.layers.%d.", l)
		out = append(out, s.layer(l, prefix, dt)...)
		out = append(out, nextN(prefix, dt, h, int64(s.Vocab), false)...)
	}
	return out, nil
}

// nextN are an inlined MTP layer's tensors beside its decoder layer:
// eh_proj, enorm, hnorm, shared_head.norm, and with own its embed_tokens
// and shared_head.head (DeepSeek-V3 ships them, GLM-4.6 not).
func nextN(prefix, dt string, h, vocab int64, own bool) []Tensor {
	out := []Tensor{{prefix + "eh_proj.weight", dt, []int64{h, 2 * h}},
		{prefix + "enorm.weight", dt, []int64{h}}, {prefix + "hnorm.weight", dt, []int64{h}},
		{prefix + "shared_head.norm.weight", dt, []int64{h}}}
	if own {
		out = append(out, Tensor{prefix + "embed_tokens.weight", dt, []int64{vocab, h}},
			Tensor{prefix + "shared_head.head.weight", dt, []int64{vocab, h}})
	}
	return out
}

// layer lists one Glm4MoeDecoderLayer's tensors in module order.
func (s glm4MoeShape) layer(l int, prefix, dt string) []Tensor {
	h, hd, q, kv := int64(s.Hidden), int64(s.HeadDim), int64(s.Heads*s.HeadDim), int64(s.KVHeads*s.HeadDim)
	var out []Tensor
	out = append(out, linear(prefix+"self_attn.q_proj", dt, q, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.k_proj", dt, kv, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.v_proj", dt, kv, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.o_proj", dt, h, q, false)...)
	if s.qkNorm {
		out = append(out, Tensor{prefix + "self_attn.q_norm.weight", dt, []int64{hd}},
			Tensor{prefix + "self_attn.k_norm.weight", dt, []int64{hd}})
	}
	out = append(out, groupedMLP(l < s.firstDense, prefix, dt, h, s.intermediate, s.moeIntermediate, s.experts, s.shared)...)
	return append(out, s.norms(prefix, dt)...)
}

// groupedMLP is a layer's MLP in the GLM-4.x / DeepSeek-V3 layout: dense,
// or per-expert keys, the router (weight, F32 e_score_correction_bias) and
// the shared experts.
func groupedMLP(dense bool, prefix, dt string, h int64, intermediate, moeIntermediate, experts, shared int) []Tensor {
	if dense {
		return gatedMLP(prefix+"mlp.", dt, h, int64(intermediate), false)
	}
	var out []Tensor
	for e := range experts {
		out = append(out, gatedMLP(fmt.Sprintf("%smlp.experts.%d.", prefix, e), dt, h, int64(moeIntermediate), false)...)
	}
	out = append(out, Tensor{prefix + "mlp.gate.weight", dt, []int64{int64(experts), h}},
		Tensor{prefix + "mlp.gate.e_score_correction_bias", "F32", []int64{int64(experts)}})
	if shared > 0 {
		out = append(out, gatedMLP(prefix+"mlp.shared_experts.", dt, h, int64(moeIntermediate*shared), false)...)
	}
	return out
}
