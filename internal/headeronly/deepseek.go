package headeronly

import "fmt"

// deepseekShape holds the config.json fields that decide a DeepSeek-V3
// family checkpoint's tensor shapes (deepseek_v3, kimi_k2, glm4_moe_lite).
type deepseekShape struct {
	decoderShape
	intermediate, moeIntermediate, experts, shared, firstDense, mtp int
	qLoRA, kvLoRA, nope, rope, v                                    int
	// mtpOwn: the MTP layers hold their own embed_tokens and
	// shared_head.head (DeepSeek-V3's release does, GLM-4.7-Flash not).
	mtpOwn bool
}

// DeepseekTensors lists the tensors a DeepseekV3ForCausalLM (or
// Glm4MoeLiteForCausalLM) checkpoint of configJSON holds as the releases
// store them: multi-head latent attention (q_a_proj, q_a_layernorm,
// q_b_proj, or q_proj without q_lora_rank; kv_a_proj_with_mqa,
// kv_a_layernorm, kv_b_proj, o_proj), dense layers below
// first_k_dense_replace, then MoE layers (router, F32
// e_score_correction_bias, per-expert keys, shared experts), and the
// num_nextn_predict_layers MTP layers inlined as model.layers.{N}.
func DeepseekTensors(configJSON []byte, dt string) ([]Tensor, error) {
	d, r, err := parseDecoder(configJSON, dt)
	if err != nil {
		return nil, err
	}
	mt := r.StringOr("model_type", "")
	s := deepseekShape{decoderShape: d,
		intermediate: r.Int("intermediate_size"), moeIntermediate: r.Int("moe_intermediate_size"),
		experts: r.Int("n_routed_experts"), shared: r.IntOr("n_shared_experts", 1),
		firstDense: r.IntOr("first_k_dense_replace", 1), mtp: r.IntOr("num_nextn_predict_layers", 0),
		qLoRA: r.IntOr("q_lora_rank", 0), kvLoRA: r.Int("kv_lora_rank"), nope: r.Int("qk_nope_head_dim"),
		rope: r.Int("qk_rope_head_dim"), v: r.Int("v_head_dim"), mtpOwn: mt != "glm4_moe_lite",
	}
	if r.Err != nil {
		return nil, r.Err
	}
	if s.intermediate <= 0 || s.moeIntermediate <= 0 || s.experts <= 0 || s.kvLoRA <= 0 || s.nope <= 0 || s.rope <= 0 || s.v <= 0 ||
		s.shared < 0 || s.mtp < 0 || s.qLoRA < 0 {
		return nil, fmt.Errorf("config.json: intermediate_size, moe_intermediate_size, n_routed_experts, kv_lora_rank and the head dims must be positive, n_shared_experts, num_nextn_predict_layers and q_lora_rank ≥ 0")
	}
	out := s.tensors(dt, func(l int, prefix string) []Tensor { return s.layer(l, prefix, dt) })
	h, v := int64(s.Hidden), int64(s.Vocab)
	for l := s.Layers; l < s.Layers+s.mtp; l++ {
		prefix := fmt.Sprintf("model.layers.%d.", l)
		out = append(out, s.layer(l, prefix, dt)...)
		out = append(out, nextN(prefix, dt, h, v, s.mtpOwn)...)
	}
	return out, nil
}

// layer lists one decoder layer's tensors in module order.
func (s deepseekShape) layer(l int, prefix, dt string) []Tensor {
	h, heads := int64(s.Hidden), int64(s.Heads)
	qk := heads * int64(s.nope+s.rope)
	a := prefix + "self_attn."
	var out []Tensor
	if s.qLoRA > 0 {
		out = append(out, linear(a+"q_a_proj", dt, int64(s.qLoRA), h, s.attentionBias)...)
		out = append(out, Tensor{a + "q_a_layernorm.weight", dt, []int64{int64(s.qLoRA)}})
		out = append(out, linear(a+"q_b_proj", dt, qk, int64(s.qLoRA), false)...)
	} else {
		out = append(out, linear(a+"q_proj", dt, qk, h, false)...)
	}
	out = append(out, linear(a+"kv_a_proj_with_mqa", dt, int64(s.kvLoRA+s.rope), h, s.attentionBias)...)
	out = append(out, Tensor{a + "kv_a_layernorm.weight", dt, []int64{int64(s.kvLoRA)}})
	out = append(out, linear(a+"kv_b_proj", dt, heads*int64(s.nope+s.v), int64(s.kvLoRA), false)...)
	out = append(out, linear(a+"o_proj", dt, h, heads*int64(s.v), s.attentionBias)...)
	out = append(out, groupedMLP(l < s.firstDense, prefix, dt, h, s.intermediate, s.moeIntermediate, s.experts, s.shared)...)
	return append(out, s.norms(prefix, dt)...)
}
