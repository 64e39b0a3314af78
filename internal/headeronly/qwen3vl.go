package headeronly

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/hf"
)

// Qwen3-VL (model_type qwen3_vl, qwen3_vl_moe): the language model's fields
// in text_config, its keys under model.language_model., the vision tower
// under model.visual. (listed first, as the state dict has it), lm_head.weight
// top level, tie_word_embeddings top level. MoE experts fused as the Hub
// releases store them: gate_up_proj [E, H, 2I], down_proj [E, I, H].

// qwen3VLShape holds the fields that decide a Qwen3-VL checkpoint's shapes.
type qwen3VLShape struct {
	decoderShape
	intermediate, moeIntermediate, experts, sparseStep int
	mlpOnly                                            []int
	vision                                             qwen3VLVision
}

type qwen3VLVision struct {
	depth, hidden, intermediate, inChannels, patch, temporalPatch, merge, positions, out, deepstack int
}

// Qwen3VLTensors lists a Qwen3VLForConditionalGeneration checkpoint's tensors.
func Qwen3VLTensors(configJSON []byte, dt string) ([]Tensor, error) {
	return qwen3VLTensors(configJSON, dt, false)
}

// Qwen3VLMoeTensors lists a Qwen3VLMoeForConditionalGeneration checkpoint's tensors.
func Qwen3VLMoeTensors(configJSON []byte, dt string) ([]Tensor, error) {
	return qwen3VLTensors(configJSON, dt, true)
}

func qwen3VLTensors(configJSON []byte, dt string, moe bool) ([]Tensor, error) {
	text, tr, err := splitTextConfig(configJSON)
	if err != nil {
		return nil, err
	}
	d, r, err := parseDecoder(text, dt)
	if err != nil {
		return nil, err
	}
	s := qwen3VLShape{decoderShape: d, intermediate: r.Int("intermediate_size")}
	if moe {
		s.moeIntermediate, s.experts = r.Int("moe_intermediate_size"), r.FirstInt("num_experts", "num_local_experts")
		s.sparseStep, s.mlpOnly = r.IntOr("decoder_sparse_step", 1), r.Ints("mlp_only_layers")
	}
	if r.Err != nil {
		return nil, r.Err
	}
	if moe && s.sparseStep <= 0 {
		return nil, fmt.Errorf("config.json: decoder_sparse_step must be positive, got %d", s.sparseStep)
	}
	s.Tied = tr.BoolOr("tie_word_embeddings", false)
	s.vision = readQwen3VLVision(tr)
	if tr.Err != nil {
		return nil, tr.Err
	}
	out := s.vision.tensors(dt)
	h, v := int64(s.Hidden), int64(s.Vocab)
	out = append(out, Tensor{"model.language_model.embed_tokens.weight", dt, []int64{v, h}})
	for l := range s.Layers {
		out = append(out, s.layer(l, fmt.Sprintf("model.language_model.layers.%d.", l), dt)...)
	}
	out = append(out, Tensor{"model.language_model.norm.weight", dt, []int64{h}})
	if !s.Tied {
		out = append(out, Tensor{"lm_head.weight", dt, []int64{v, h}})
	}
	return out, nil
}

// layer: attention with q/k norms, then a fused sparse block or a dense MLP,
// then the norms.
func (s qwen3VLShape) layer(l int, prefix, dt string) []Tensor {
	h, hd := int64(s.Hidden), int64(s.HeadDim)
	out := append(s.attention(prefix, dt),
		Tensor{prefix + "self_attn.q_norm.weight", dt, []int64{hd}},
		Tensor{prefix + "self_attn.k_norm.weight", dt, []int64{hd}})
	if s.experts > 0 && !slices.Contains(s.mlpOnly, l) && (l+1)%s.sparseStep == 0 {
		e, i := int64(s.experts), int64(s.moeIntermediate)
		out = append(out, Tensor{prefix + "mlp.experts.gate_up_proj", dt, []int64{e, h, 2 * i}},
			Tensor{prefix + "mlp.experts.down_proj", dt, []int64{e, i, h}},
			Tensor{prefix + "mlp.gate.weight", dt, []int64{e, h}})
	} else {
		out = append(out, gatedMLP(prefix+"mlp.", dt, h, int64(s.intermediate), false)...)
	}
	return append(out, s.norms(prefix, dt)...)
}

// splitTextConfig returns a multimodal config's text_config as JSON, and a
// reader of the whole config for its top-level fields.
func splitTextConfig(configJSON []byte) ([]byte, *hf.Reader, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(configJSON, &top); err != nil {
		return nil, nil, fmt.Errorf("config.json: %w", err)
	}
	text, ok := top["text_config"]
	if !ok {
		return nil, nil, fmt.Errorf("config.json: text_config is missing")
	}
	c, err := hf.Parse(configJSON)
	if err != nil {
		return nil, nil, err
	}
	return text, &hf.Reader{Config: c}, nil
}

// readQwen3VLVision reads top's vision_config, if any, keeping its errors
// in top.
func readQwen3VLVision(top *hf.Reader) qwen3VLVision {
	c, ok := top.Object("vision_config")
	if !ok {
		return qwen3VLVision{}
	}
	vr := &hf.Reader{Config: c}
	v := qwen3VLVision{depth: vr.Int("depth"), hidden: vr.Int("hidden_size"), intermediate: vr.Int("intermediate_size"),
		inChannels: vr.IntOr("in_channels", 3), patch: vr.Int("patch_size"), temporalPatch: vr.IntOr("temporal_patch_size", 2),
		merge: vr.IntOr("spatial_merge_size", 2), positions: vr.Int("num_position_embeddings"), out: vr.Int("out_hidden_size"),
		deepstack: len(vr.Ints("deepstack_visual_indexes"))}
	if vr.Err != nil {
		top.Fail(vr.Err)
	}
	return v
}

// tensors lists the vision tower's: patch embedding (Conv3d), the learned
// position table, the blocks, the merger and the DeepStack mergers.
func (v qwen3VLVision) tensors(dt string) []Tensor {
	if v.depth == 0 {
		return nil
	}
	hv, iv, merged, out := int64(v.hidden), int64(v.intermediate), int64(v.hidden*v.merge*v.merge), int64(v.out)
	p := "model.visual."
	ts := []Tensor{{p + "patch_embed.proj.weight", dt, []int64{hv, int64(v.inChannels), int64(v.temporalPatch), int64(v.patch), int64(v.patch)}},
		{p + "patch_embed.proj.bias", dt, []int64{hv}},
		{p + "pos_embed.weight", dt, []int64{int64(v.positions), hv}}}
	for b := range v.depth {
		bp := fmt.Sprintf("%sblocks.%d.", p, b)
		ts = append(ts, Tensor{bp + "norm1.weight", dt, []int64{hv}}, Tensor{bp + "norm1.bias", dt, []int64{hv}},
			Tensor{bp + "norm2.weight", dt, []int64{hv}}, Tensor{bp + "norm2.bias", dt, []int64{hv}})
		ts = append(ts, linear(bp+"attn.qkv", dt, 3*hv, hv, true)...)
		ts = append(ts, linear(bp+"attn.proj", dt, hv, hv, true)...)
		ts = append(ts, linear(bp+"mlp.linear_fc1", dt, iv, hv, true)...)
		ts = append(ts, linear(bp+"mlp.linear_fc2", dt, hv, iv, true)...)
	}
	merger := func(mp string, norm int64) []Tensor {
		t := []Tensor{{mp + "norm.weight", dt, []int64{norm}}, {mp + "norm.bias", dt, []int64{norm}}}
		t = append(t, linear(mp+"linear_fc1", dt, merged, merged, true)...)
		return append(t, linear(mp+"linear_fc2", dt, out, merged, true)...)
	}
	ts = append(ts, merger(p+"merger.", hv)...)
	for k := range v.deepstack {
		ts = append(ts, merger(fmt.Sprintf("%sdeepstack_merger_list.%d.", p, k), merged)...)
	}
	return ts
}
