// Package qwen35 exports the hybrid linear-attention Qwen
// decoders: Qwen3-Next (model_type qwen3_next), Qwen3.5 dense and MoE as
// causal LMs (qwen3_5_text, qwen3_5_moe_text) and the language model of the
// natively multimodal releases (qwen3_5, qwen3_5_moe: text_config, keys
// under model.language_model.). layer_types chooses, per layer, gated
// DeltaNet linear attention (conv_state and recurrent_state caches) or
// gated full attention (the KV cache); every RMSNorm but the DeltaNet's
// gated one weighs by 1 + w.
package qwen35

import (
	"fmt"
	"strconv"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// Plugin is the qwen35 plugin; cmd/strata-plugin-qwen35 serves it.
func Plugin() sdk.Architecture { return plugin }

// family is what differs between the model types.
type family struct {
	// fusedInProj: Qwen3-Next's in_proj_qkvz and in_proj_ba, interleaved
	// per key head; else Qwen3.5's in_proj_qkv, _z, _b, _a.
	fusedInProj bool
	// mlp: "dense" every layer, "moe" every layer (Qwen3.5-MoE, router
	// always renormalised), "qwen" (Qwen3-Next: decoder_sparse_step,
	// mlp_only_layers, norm_topk_prob).
	mlp string
}

func arch(modelType, hfArch, name string, fam family, multimodal bool) decoder.Architecture {
	a := decoder.Architecture{ModelType: modelType, HFArchitectures: []string{hfArch}, Name: name,
		Capabilities: &pb.Capabilities{Layerwise: true, MtpConventions: []string{mtpIndexed}, Models: []string{decoder.ModelMTP}},
		Options:      []*pb.PluginOption{maxSeqOption(), decoder.MTPOption()},
		Load:         func(m *decoder.Model) error { return load(m, name, fam, multimodal) }}
	if fam.mlp != "dense" {
		a.Capabilities.ExpertLayouts = []string{"per-expert", "fused"}
		a.Options = append(a.Options, decoder.MoEStrategyOption())
	}
	if multimodal {
		a.ConfigObject, a.Prefix = "text_config", "model.language_model."
		multimodalOptions(&a)
	}
	return a
}

var plugin = decoder.Plugin{Name: "qwen35", Version: "0.1.0", Architectures: []decoder.Architecture{
	arch("qwen3_next", "Qwen3NextForCausalLM", "Qwen3Next", family{fusedInProj: true, mlp: "qwen"}, false),
	arch("qwen3_5_text", "Qwen3_5ForCausalLM", "Qwen3_5", family{mlp: "dense"}, false),
	arch("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", "Qwen3_5Moe", family{mlp: "moe"}, false),
	arch("qwen3_5", "Qwen3_5ForConditionalGeneration", "Qwen3_5", family{mlp: "dense"}, true),
	arch("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5Moe", family{mlp: "moe"}, true),
}}

// Layer types as layer_types names them.
const (
	linearType = "linear_attention"
	fullType   = "full_attention"
)

func load(m *decoder.Model, name string, fam family, multimodal bool) error {
	decoder.RequireSiLU(m.Reader, "qwen35")
	bias := m.BoolOr("attention_bias", false)
	types := layerTypes(m)
	if m.Err != nil {
		return m.Err
	}
	if err := refuse(m, multimodal); err != nil {
		return err
	}
	if err := partialRotary(m); err != nil {
		return err
	}
	m.NormOnePlus = true
	linear, err := readLinear(m, fam)
	if err != nil {
		return err
	}
	mlps, err := readMLPs(m, fam)
	if err != nil {
		return err
	}
	m.KindOf = func(i int) string { return kindName(types[i], mlps.kind(i)) }
	declared := map[string]bool{}
	for i := range m.Layers {
		kind := m.KindOf(i)
		if declared[kind] {
			continue
		}
		declared[kind] = true
		declareKind(m, kind, name+kindFunction[types[i]]+kindFunction[mlps.kind(i)]+"DecoderLayer", types[i], mlps.kind(i), bias, linear, mlps)
	}
	if err := withVision(m); err != nil {
		return err
	}
	return declareMTP(m, name, mlps, fullBody(bias, mlps))
}

// declareKind declares the kind of layers of one layer type and MLP kind.
func declareKind(m *decoder.Model, name, fn, typ, mlp string, bias bool, linear *linearAttention, mlps mlps) {
	if typ == linearType {
		k := m.Kind(name, fn, func(l *decoder.Layer) error {
			return l.MixerResidual(linear.mixer(), layerNorms[0], mlps.block(mlp), layerNorms[1])
		})
		k.Caches = linear.caches
		return
	}
	m.Kind(name, fn, fullBody(bias, mlps)(mlp))
}

var layerNorms = [2]decoder.Norms{{Pre: "input_layernorm"}, {Pre: "post_attention_layernorm"}}

// fullBody is the body of a gated full-attention layer with an MLP kind.
func fullBody(bias bool, mlps mlps) func(mlp string) func(*decoder.Layer) error {
	return func(mlp string) func(*decoder.Layer) error {
		return func(l *decoder.Layer) error {
			attn := &decoder.Attention{QKVBias: bias, OBias: bias, QKNorm: true, OutputGate: true}
			return l.MixerResidual(attn, layerNorms[0], mlps.block(mlp), layerNorms[1])
		}
	}
}

var kindFunction = map[string]string{linearType: "GatedDeltaNet", fullType: "Attention", mlpMoE: "Moe", mlpDense: ""}

// kindName is the plan's name of a layer kind: linear or full, and moe or
// dense.
func kindName(typ, mlp string) string {
	t := "full"
	if typ == linearType {
		t = "linear"
	}
	return t + "_" + mlp
}

// layerTypes reads layer_types, or derives it as transformers does from
// full_attention_interval (every interval-th layer full, default 4).
func layerTypes(m *decoder.Model) []string {
	if !m.Config.Has("layer_types") {
		interval := m.IntOr("full_attention_interval", 4)
		if interval < 1 {
			m.Fail(fmt.Errorf("%s: full_attention_interval must be positive, got %d", m.Config.Path(), interval))
			return nil
		}
		types := make([]string, m.Layers)
		for i := range types {
			types[i] = linearType
			if (i+1)%interval == 0 {
				types[i] = fullType
			}
		}
		return types
	}
	types := m.Strings("layer_types")
	if m.Err != nil {
		return nil
	}
	if len(types) != m.Layers {
		m.Fail(fmt.Errorf("%s: layer_types lists %d layers, num_hidden_layers is %d", m.Config.Path(), len(types), m.Layers))
		return nil
	}
	for i, t := range types {
		if t != linearType && t != fullType {
			m.Fail(fmt.Errorf("%s: layer_types[%d] is %q; the qwen35 plugin knows %s and %s", m.Config.Path(), i, t, linearType, fullType))
			return nil
		}
	}
	return types
}

// refuse names the config fields that would change the math and are not
// implemented.
func refuse(m *decoder.Model, multimodal bool) error {
	for _, field := range []string{"use_sliding_window"} {
		if v, err := m.Config.BoolOr(field, false); err != nil || v {
			return fmt.Errorf("%s: %s is set; the qwen35 plugin does not implement it (remove it only if the model does not use it)", m.Config.Path(), field)
		}
	}
	// Fields some releases carry that transformers never reads: it always
	// gates the attention output by sigmoid and the DeltaNet norm by SiLU
	// (swish). Another value asks for math the reference does not compute.
	if gate, err := m.Config.BoolOr("attn_output_gate", true); err != nil || !gate {
		return fmt.Errorf("%s: attn_output_gate is false; transformers (and this plugin) always gate the attention output", m.Config.Path())
	}
	if act, err := m.Config.StringOr("output_gate_type", "swish"); err != nil || act != "swish" && act != "silu" {
		return fmt.Errorf("%s: output_gate_type %q; transformers (and this plugin) gate the DeltaNet output by swish (SiLU) only", m.Config.Path(), act)
	}
	if multimodal {
		tied, err := m.Top.BoolOr("tie_word_embeddings", false) // the one transformers obeys
		if err != nil {
			return err
		}
		m.Tied = tied
		addVision(m)
	}
	return mtpLayout(m)
}

// partialRotary applies transformers' default partial_rotary_factor of
// these models, 0.25, when config.json gives none.
func partialRotary(m *decoder.Model) error {
	if m.Config.Has("partial_rotary_factor") {
		return nil
	}
	if params, ok, err := m.Config.Object("rope_parameters"); err != nil || ok && params.Has("partial_rotary_factor") {
		return err
	}
	dim := m.HeadDim / 4
	if dim < 2 || dim%2 != 0 {
		return fmt.Errorf("%s: rotary dimension %d (head_dim %d × the default partial_rotary_factor 0.25) must be even and at least 2", m.Config.Path(), dim, m.HeadDim)
	}
	m.RoPE.Dim = dim
	return nil
}

// maxSeqOption is the longest call (prefill chunk) the delta rule's
// parallel form is built for.
const optMaxSeq = "delta_rule_max_seq_len"

func maxSeqOption() *pb.PluginOption {
	var allowed []string
	for n := 16; n <= 8192; n *= 2 {
		allowed = append(allowed, strconv.Itoa(n))
	}
	// 4096 by default: a long prompt in one call must not be NaN for want
	// of an option; the squarings it adds are exact (powers past seq_len are
	// structural zeros) and cost only time.
	return &pb.PluginOption{Name: optMaxSeq, DefaultValue: "4096", AllowedValues: allowed,
		Help: "the longest seq_len of a call (prefill chunk) the linear attention's parallel form is exact for; longer calls give NaN logits. Its cost grows with log2 of it"}
}
