package headeronly

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/hf"
)

// The hybrid linear-attention Qwen decoders, as the Hub releases store them:
//
//   - qwen3_next (Qwen3-Next): in_proj_qkvz and in_proj_ba fused, experts per
//     expert (mlp.experts.<e>.{gate,up,down}_proj.weight), Qwen's sparse-layer
//     rule, and one MTP layer that config.json does not declare (every
//     Qwen3-Next release ships it; num_nextn_predict_layers overrides).
//   - qwen3_5_text, qwen3_5_moe_text (Qwen3.5 as a causal LM) and qwen3_5,
//     qwen3_5_moe (the natively multimodal releases: text_config, language
//     model under model.language_model., vision tower under model.visual.):
//     in_proj_qkv, _z, _b, _a separate; MoE experts fused as the releases
//     store them (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]);
//     mtp_num_hidden_layers MTP layers.
//
// Every layer is linear attention (gated DeltaNet) or full attention (q_proj
// holds query and gate rows), by layer_types or every
// full_attention_interval-th layer; the MTP weights are top-level mtp.*: fc
// over [embedding; hidden], full-attention layers, their norms.

// qwen35Family is what differs between the model types.
type qwen35Family struct {
	fusedInProj  bool // Qwen3-Next's in_proj_qkvz, in_proj_ba
	moe          bool
	fusedExperts bool   // gate_up_proj/down_proj stacked over experts
	sparseRule   bool   // decoder_sparse_step and mlp_only_layers apply
	mtpField     string // the config field counting MTP layers
	mtpDefault   int
	multimodal   bool
}

var qwen35Families = map[string]qwen35Family{
	"qwen3_next":       {fusedInProj: true, moe: true, sparseRule: true, mtpField: "num_nextn_predict_layers", mtpDefault: 1},
	"qwen3_5_text":     {mtpField: "mtp_num_hidden_layers"},
	"qwen3_5_moe_text": {moe: true, fusedExperts: true, mtpField: "mtp_num_hidden_layers"},
	"qwen3_5":          {mtpField: "mtp_num_hidden_layers", multimodal: true},
	"qwen3_5_moe":      {moe: true, fusedExperts: true, mtpField: "mtp_num_hidden_layers", multimodal: true},
}

// qwen35Generator is the generator of one of qwen35Families' model types.
func qwen35Generator(modelType string) func(configJSON []byte, dt string) ([]Tensor, error) {
	fam := qwen35Families[modelType]
	return func(configJSON []byte, dt string) ([]Tensor, error) {
		s, err := parseQwen35(configJSON, dt, fam)
		if err != nil {
			return nil, err
		}
		return s.tensors(dt), nil
	}
}

// qwen35Shape holds the fields that decide the checkpoint's shapes.
type qwen35Shape struct {
	decoderShape
	fam                                          qwen35Family
	prefix                                       string // of the language model's keys
	full                                         []bool // layer l is full attention
	kHeads, vHeads, kDim, vDim, kernel           int
	experts, moeIntermediate, shared, sparseStep int
	mlpOnly                                      []int
	mtp                                          int
	vision                                       qwen3VLVision
}

func parseQwen35(configJSON []byte, dt string, fam qwen35Family) (qwen35Shape, error) {
	text, top := configJSON, (*hf.Reader)(nil)
	if fam.multimodal {
		var err error
		if text, top, err = splitTextConfig(configJSON); err != nil {
			return qwen35Shape{}, err
		}
	}
	d, r, err := parseDecoder(text, dt)
	if err != nil {
		return qwen35Shape{}, err
	}
	s := qwen35Shape{decoderShape: d, fam: fam, prefix: "model.",
		kHeads: r.Int("linear_num_key_heads"), vHeads: r.Int("linear_num_value_heads"),
		kDim: r.Int("linear_key_head_dim"), vDim: r.Int("linear_value_head_dim"),
		kernel: r.Int("linear_conv_kernel_dim"), mtp: r.IntOr(fam.mtpField, fam.mtpDefault)}
	if fam.moe {
		s.experts, s.moeIntermediate = r.FirstInt("num_experts", "num_local_experts"), r.Int("moe_intermediate_size")
		s.shared = r.Int("shared_expert_intermediate_size")
		s.sparseStep, s.mlpOnly = 1, nil
		if fam.sparseRule {
			s.sparseStep, s.mlpOnly = r.IntOr("decoder_sparse_step", 1), r.Ints("mlp_only_layers")
		}
	}
	s.full = qwen35LayerTypes(r, s.Layers)
	if r.Err != nil {
		return qwen35Shape{}, r.Err
	}
	if err := s.check(); err != nil {
		return qwen35Shape{}, err
	}
	if fam.multimodal {
		s.prefix = "model.language_model."
		if err := s.readTop(top); err != nil {
			return qwen35Shape{}, err
		}
	}
	return s, nil
}

// check refuses sizes no checkpoint could have.
func (s qwen35Shape) check() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"linear_num_key_heads", s.kHeads}, {"linear_num_value_heads", s.vHeads}, {"linear_key_head_dim", s.kDim},
		{"linear_value_head_dim", s.vDim}, {"linear_conv_kernel_dim", s.kernel}} {
		if f.v <= 0 {
			return fmt.Errorf("config.json: %s must be positive, got %d", f.name, f.v)
		}
	}
	if s.vHeads%s.kHeads != 0 {
		return fmt.Errorf("config.json: linear_num_value_heads (%d) must be a multiple of linear_num_key_heads (%d)", s.vHeads, s.kHeads)
	}
	if !s.fam.moe && s.Intermediate <= 0 {
		return fmt.Errorf("config.json: intermediate_size must be positive, got %d", s.Intermediate)
	}
	if s.mtp < 0 {
		return fmt.Errorf("config.json: %s must be ≥ 0, got %d", s.fam.mtpField, s.mtp)
	}
	if s.fam.moe && (s.experts <= 0 || s.moeIntermediate <= 0 || s.shared <= 0 || s.sparseStep <= 0) {
		return fmt.Errorf("config.json: num_experts (%d), moe_intermediate_size (%d), shared_expert_intermediate_size (%d) and decoder_sparse_step (%d) must be positive",
			s.experts, s.moeIntermediate, s.shared, s.sparseStep)
	}
	return nil
}

// readTop reads a multimodal config's top-level fields: the tie (the one
// transformers obeys) and the vision tower.
func (s *qwen35Shape) readTop(top *hf.Reader) error {
	s.Tied = top.BoolOr("tie_word_embeddings", false)
	s.vision = readQwen3VLVision(top)
	return top.Err
}

// qwen35LayerTypes reads layer_types (true: full attention), or derives it
// as transformers does: every full_attention_interval-th layer (default 4).
func qwen35LayerTypes(r *hf.Reader, layers int) []bool {
	full := make([]bool, layers)
	if !r.Config.Has("layer_types") {
		interval := r.IntOr("full_attention_interval", 4)
		if interval < 1 {
			r.Fail(fmt.Errorf("config.json: full_attention_interval must be positive, got %d", interval))
			return nil
		}
		for l := range full {
			full[l] = (l+1)%interval == 0
		}
		return full
	}
	types := r.Strings("layer_types")
	if r.Err == nil && len(types) != layers {
		r.Fail(fmt.Errorf("config.json: layer_types lists %d layers, num_hidden_layers is %d", len(types), layers))
	}
	for l, t := range types {
		if t != "linear_attention" && t != "full_attention" {
			r.Fail(fmt.Errorf("config.json: layer_types[%d] is %q, neither linear_attention nor full_attention", l, t))
		}
		if l < layers {
			full[l] = t == "full_attention"
		}
	}
	return full
}

// tensors lists the checkpoint in state-dict order: vision tower, embedding,
// layers, final norm, head unless tied, then the MTP weights.
func (s qwen35Shape) tensors(dt string) []Tensor {
	h, v := int64(s.Hidden), int64(s.Vocab)
	out := s.vision.tensors(dt)
	out = append(out, Tensor{s.prefix + "embed_tokens.weight", dt, []int64{v, h}})
	for l := range s.Layers {
		out = append(out, s.layer(fmt.Sprintf("%slayers.%d.", s.prefix, l), s.full[l], s.sparse(l), dt)...)
	}
	out = append(out, Tensor{s.prefix + "norm.weight", dt, []int64{h}})
	if !s.Tied {
		out = append(out, Tensor{"lm_head.weight", dt, []int64{v, h}})
	}
	return append(out, s.mtpTensors(dt)...)
}

// mtpTensors are the MTP weights: fc [H, 2H] over the concatenated normed
// embedding and hidden state, full-attention layers with the model's MLP,
// the final norm and the two pre-fc norms.
func (s qwen35Shape) mtpTensors(dt string) []Tensor {
	if s.mtp == 0 {
		return nil
	}
	h := int64(s.Hidden)
	out := linear("mtp.fc", dt, h, 2*h, false)
	for l := range s.mtp {
		out = append(out, s.layer(fmt.Sprintf("mtp.layers.%d.", l), true, s.fam.moe, dt)...)
	}
	return append(out, Tensor{"mtp.norm.weight", dt, []int64{h}},
		Tensor{"mtp.pre_fc_norm_embedding.weight", dt, []int64{h}},
		Tensor{"mtp.pre_fc_norm_hidden.weight", dt, []int64{h}})
}

// layer lists one decoder layer's tensors: its mixer, its MLP, its norms.
func (s qwen35Shape) layer(prefix string, full, sparse bool, dt string) []Tensor {
	var out []Tensor
	if full {
		out = s.gatedAttention(prefix, dt)
	} else {
		out = s.deltaNet(prefix+"linear_attn.", dt)
	}
	if sparse {
		out = append(out, s.moe(prefix+"mlp.", dt)...)
	} else {
		out = append(out, gatedMLP(prefix+"mlp.", dt, int64(s.Hidden), int64(s.Intermediate), false)...)
	}
	return append(out, s.norms(prefix, dt)...)
}

// gatedAttention is full attention whose q_proj holds, per head, the query
// rows then the output gate's.
func (s qwen35Shape) gatedAttention(prefix, dt string) []Tensor {
	h, hd, q, kv := int64(s.Hidden), int64(s.HeadDim), int64(s.Heads*s.HeadDim), int64(s.KVHeads*s.HeadDim)
	var out []Tensor
	out = append(out, linear(prefix+"self_attn.q_proj", dt, 2*q, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.k_proj", dt, kv, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.v_proj", dt, kv, h, s.attentionBias)...)
	out = append(out, linear(prefix+"self_attn.o_proj", dt, h, q, s.attentionBias)...)
	return append(out, Tensor{prefix + "self_attn.q_norm.weight", dt, []int64{hd}},
		Tensor{prefix + "self_attn.k_norm.weight", dt, []int64{hd}})
}

// deltaNet is the gated DeltaNet: in-projections, the depthwise conv over
// q, k and v channels, A_log, dt_bias, the gated norm, out_proj.
func (s qwen35Shape) deltaNet(p, dt string) []Tensor {
	h, vh := int64(s.Hidden), int64(s.vHeads)
	keys, values := int64(s.kHeads*s.kDim), int64(s.vHeads*s.vDim)
	channels := 2*keys + values
	out := []Tensor{{p + "conv1d.weight", dt, []int64{channels, 1, int64(s.kernel)}}}
	if s.fam.fusedInProj {
		out = append(out, linear(p+"in_proj_qkvz", dt, channels+values, h, false)...)
		out = append(out, linear(p+"in_proj_ba", dt, 2*vh, h, false)...)
	} else {
		out = append(out, linear(p+"in_proj_qkv", dt, channels, h, false)...)
		out = append(out, linear(p+"in_proj_z", dt, values, h, false)...)
		out = append(out, linear(p+"in_proj_b", dt, vh, h, false)...)
		out = append(out, linear(p+"in_proj_a", dt, vh, h, false)...)
	}
	out = append(out, Tensor{p + "dt_bias", dt, []int64{vh}}, Tensor{p + "A_log", dt, []int64{vh}},
		Tensor{p + "norm.weight", dt, []int64{int64(s.vDim)}})
	return append(out, linear(p+"out_proj", dt, h, values, false)...)
}

// moe is the sparse block: router, routed experts (per expert or fused),
// the shared expert and its sigmoid gate.
func (s qwen35Shape) moe(p, dt string) []Tensor {
	h, e, i := int64(s.Hidden), int64(s.experts), int64(s.moeIntermediate)
	out := linear(p+"gate", dt, e, h, false)
	if s.fam.fusedExperts {
		out = append(out, Tensor{p + "experts.gate_up_proj", dt, []int64{e, 2 * i, h}},
			Tensor{p + "experts.down_proj", dt, []int64{e, h, i}})
	} else {
		for x := range s.experts {
			out = append(out, gatedMLP(fmt.Sprintf("%sexperts.%d.", p, x), dt, h, i, false)...)
		}
	}
	out = append(out, gatedMLP(p+"shared_expert.", dt, h, int64(s.shared), false)...)
	return append(out, linear(p+"shared_expert_gate", dt, 1, h, false)...)
}

// sparse is whether layer l's MLP is the MoE block: every layer of the
// Qwen3.5 MoE models, transformers' Qwen rule for Qwen3-Next.
func (s qwen35Shape) sparse(l int) bool {
	return s.fam.moe && !slices.Contains(s.mlpOnly, l) && (l+1)%s.sparseStep == 0
}
