package deepseek

import (
	"fmt"
	"math"
	"slices"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const (
	kindMoE   = "moe"
	kindDense = "dense"
	// optForm chooses how attention reads the cached latent.
	optForm = "mla_form"
)

// deepseekDefaults are DeepseekV3Config's values for the fields this
// plugin reads, where they differ from the common decoder's (Kimi-K2's
// remote DeepseekV3Config has the same).
var deepseekDefaults = map[string]any{
	"n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
	"n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": true, "first_k_dense_replace": 3,
	"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
	"rope_interleave": true, "attention_bias": false, "max_position_embeddings": 4096,
}

// liteDefaults are Glm4MoeLiteConfig's.
var liteDefaults = map[string]any{
	"n_routed_experts": 64, "num_experts_per_tok": 4, "moe_intermediate_size": 1536, "n_shared_experts": 1,
	"n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.8, "norm_topk_prob": true,
	"q_lora_rank": 768, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192, "v_head_dim": 256,
	"rope_interleave": true, "attention_bias": false, "max_position_embeddings": 202752, "rms_norm_eps": 1e-5,
}

func arch(modelType, hfArch, name string, defaults map[string]any) decoder.Architecture {
	return decoder.Architecture{ModelType: modelType, HFArchitectures: []string{hfArch}, Name: name,
		Capabilities: &pb.Capabilities{Layerwise: true, ExpertLayouts: []string{"per-expert", "fused"},
			MtpConventions: []string{decoder.MTPInlined, decoder.MTPIndexed, decoder.MTPSeparateFile}, Models: []string{decoder.ModelMTP}},
		Options:  []*pb.PluginOption{decoder.MoEStrategyOption(), decoder.MTPOption(), formOption()},
		Defaults: defaults,
		Load:     func(m *decoder.Model) error { return load(m, name, modelType == "glm4_moe_lite") },
	}
}

var plugin = decoder.Plugin{Name: "deepseek", Version: "0.1.0", Architectures: []decoder.Architecture{
	arch("deepseek_v3", "DeepseekV3ForCausalLM", "DeepseekV3", deepseekDefaults),
	// Kimi-K2's config.json names its own model_type and DeepSeek-V3's class.
	arch("kimi_k2", "DeepseekV3ForCausalLM", "DeepseekV3", deepseekDefaults),
	arch("glm4_moe_lite", "Glm4MoeLiteForCausalLM", "Glm4MoeLite", liteDefaults),
}}

// formOption: absorbed by default, what an accelerator wants for decode: a
// step reads the cached latent once, where expanded projects every cached
// row through kv_b_proj again (measured under ONNX Runtime, 1 thread, a
// random 16-head model with kv_lora_rank 256, on the loaded 2-core machine:
// decode at position 4094 21.5 ms absorbed vs 328 ms expanded; a 256-token
// prefill 2.6 s vs 1.8 s, where expanded's larger matmuls win).
func formOption() *pb.PluginOption {
	return &pb.PluginOption{Name: optForm, DefaultValue: blocks.MLAAbsorbed, AllowedValues: []string{blocks.MLAAbsorbed, blocks.MLAExpanded},
		Help: "absorbed: kv_b_proj folded into the query and the output, attention over the cached latent (decode reads compressed_kv once); " +
			"expanded: the cached latent projected to per-head keys and values at every call, as transformers computes it"}
}

func load(m *decoder.Model, name string, layerTypes bool) error {
	decoder.RequireSiLU(m.Reader, "deepseek")
	mla := &decoder.MLA{QLoRARank: m.IntOr("q_lora_rank", 0), Rank: m.Int("kv_lora_rank"), NopeDim: m.Int("qk_nope_head_dim"),
		RopeDim: m.Int("qk_rope_head_dim"), VDim: m.Int("v_head_dim"), Bias: m.BoolOr("attention_bias", false),
		Interleave: m.BoolOr("rope_interleave", true), Form: m.Options[optForm]}
	if m.Err != nil {
		return m.Err
	}
	if err := refuse(m); err != nil {
		return err
	}
	if err := checkMLA(m, mla); err != nil {
		return err
	}
	kind, err := mlpKinds(m, layerTypes)
	if err != nil {
		return err
	}
	moe, err := decoder.ReadGroupedMoE(m)
	if err != nil {
		return err
	}
	mtp, err := decoder.DetectNextN(m)
	if err != nil {
		return err
	}
	m.KindOf, m.SlotsCache = kind, decoder.KPE
	if err := moe.Detect(m, kindMoE, mtp); err != nil {
		return err
	}
	caches := func(m *decoder.Model) []*pb.CacheSpec { return decoder.MLACaches(m.Export, mla.Rank, mla.RopeDim) }
	attention := func() *decoder.MLA { a := *mla; return &a }
	norms := [2]decoder.Norms{{Pre: "input_layernorm"}, {Pre: "post_attention_layernorm"}}
	m.Kind(kindMoE, name+"DecoderLayer", func(l *decoder.Layer) error {
		return l.MixerResidual(attention(), norms[0], moe.Block(m.Options[decoder.MoEStrategy]), norms[1])
	}).Caches = caches
	m.Kind(kindDense, name+"DenseDecoderLayer", func(l *decoder.Layer) error {
		return l.MixerResidual(attention(), norms[0], &decoder.SwiGLU{Width: m.Intermediate}, norms[1])
	}).Caches = caches
	return mtp.Declare(m, kind)
}

// refuse names the remote-code config fields (DeepSeek's own
// configuration_deepseek.py) whose other values ask for routing
// transformers does not compute.
func refuse(m *decoder.Model) error {
	for _, f := range []struct{ key, want string }{{"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}} {
		if v := m.StringOr(f.key, f.want); m.Err == nil && v != f.want {
			return fmt.Errorf("%s: %s %q: the deepseek plugin routes as transformers' DeepseekV3TopkRouter does (%s %q) only", m.Config.Path(), f.key, v, f.key, f.want)
		}
	}
	if freq := m.IntOr("moe_layer_freq", 1); m.Err == nil && freq != 1 {
		return fmt.Errorf("%s: moe_layer_freq %d: the deepseek plugin makes every layer from first_k_dense_replace on MoE (moe_layer_freq 1) only", m.Config.Path(), freq)
	}
	return m.Err
}

// checkMLA checks the latent attention's sizes, turns the RoPE to
// qk_rope_head_dim and sets the softmax scale as transformers does.
func checkMLA(m *decoder.Model, a *decoder.MLA) error {
	path := m.Config.Path()
	for _, f := range []struct {
		name string
		v    int
	}{{"kv_lora_rank", a.Rank}, {"qk_nope_head_dim", a.NopeDim}, {"qk_rope_head_dim", a.RopeDim}, {"v_head_dim", a.VDim}} {
		if f.v <= 0 {
			return fmt.Errorf("%s: %s must be positive, got %d", path, f.name, f.v)
		}
	}
	if a.QLoRARank < 0 || a.QLoRARank == 0 && m.Config.Has("q_lora_rank") {
		return fmt.Errorf("%s: q_lora_rank must be positive, or null for q_proj without the low-rank query, got %d", path, a.QLoRARank)
	}
	rope, err := blocks.RoPEFromConfig(m.Config, a.RopeDim)
	if err != nil {
		return err
	}
	if rope.Dim != a.RopeDim {
		return fmt.Errorf("%s: partial_rotary_factor makes %d rotary dimensions of qk_rope_head_dim %d; the latent attention rotates all of them", path, rope.Dim, a.RopeDim)
	}
	m.RoPE = rope
	a.Scaling = math.Pow(float64(a.NopeDim+a.RopeDim), -0.5)
	mscaleAll, err := ropeParam(m, "mscale_all_dim")
	if err != nil {
		return err
	}
	if rope.Type != "default" && mscaleAll != 0 && rope.Factor > 1 {
		s := 0.1*mscaleAll*math.Log(rope.Factor) + 1 // yarn_get_mscale
		a.Scaling *= s * s
	}
	return nil
}

// ropeParam reads a number from rope_parameters, else rope_scaling (0 when
// absent).
func ropeParam(m *decoder.Model, key string) (float64, error) {
	for _, obj := range []string{"rope_parameters", "rope_scaling"} {
		p, ok, err := m.Config.Object(obj)
		if err != nil {
			return 0, err
		}
		if ok {
			return p.FloatOr(key, 0)
		}
	}
	return 0, nil
}

// mlpKinds: first_k_dense_replace for DeepSeek-V3; with layerTypes
// (glm4_moe_lite) mlp_layer_types, "dense" or "sparse" per layer, by
// default the first dense, as transformers reads them (it ignores
// first_k_dense_replace there). MTP layers past the decoder layers are MoE.
func mlpKinds(m *decoder.Model, layerTypes bool) (func(i int) string, error) {
	if !layerTypes {
		return decoder.FirstDense(m.Int("first_k_dense_replace"), kindDense, kindMoE)
	}
	types := []string{"dense"}
	for len(types) < m.Layers {
		types = append(types, "sparse")
	}
	if m.Config.Has("mlp_layer_types") {
		types = m.Strings("mlp_layer_types")
		if m.Err != nil {
			return nil, m.Err
		}
	}
	if len(types) != m.Layers {
		return nil, fmt.Errorf("%s: mlp_layer_types lists %d layers, num_hidden_layers is %d", m.Config.Path(), len(types), m.Layers)
	}
	for i, t := range types {
		if !slices.Contains([]string{"dense", "sparse"}, t) {
			return nil, fmt.Errorf("%s: mlp_layer_types[%d] is %q; transformers knows dense and sparse", m.Config.Path(), i, t)
		}
	}
	return func(i int) string {
		if i < len(types) && types[i] == "dense" {
			return kindDense
		}
		return kindMoE
	}, nil
}
