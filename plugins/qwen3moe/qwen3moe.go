package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/build"
	"github.com/strata-llm/strata/sdk/hf"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const (
	pluginName    = "qwen3moe"
	pluginVersion = "0.1.0"
	modelType     = "qwen3_moe"
	domain        = "strata.qwen3moe"
	kindMoE       = "moe"
	kindDense     = "dense"
	optStrategy   = "moe_strategy"
)

type qwen3moe struct{}

var _ sdk.Architecture = qwen3moe{}

func (qwen3moe) Describe(context.Context) (*pb.DescribeResponse, error) {
	return &pb.DescribeResponse{
		Name: pluginName, Version: pluginVersion, ProtocolVersion: sdk.ProtocolVersion, SdkVersion: sdk.Version,
		Architectures: []*pb.ArchitectureSupport{{
			ModelType:       modelType,
			HfArchitectures: []string{"Qwen3MoeForCausalLM"},
			Capabilities:    &pb.Capabilities{Layerwise: true, ExpertLayouts: []string{"per-expert", "fused"}},
		}},
	}, nil
}

func (qwen3moe) Check(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	_, err := load(req.GetModel())
	return sdk.CheckResult(err), nil
}

func (qwen3moe) Plan(_ context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error) {
	cfg, err := load(req.GetModel())
	if err != nil {
		return nil, err
	}
	if _, err := options(req.GetOptions()); err != nil {
		return nil, err
	}
	caches := build.KVCaches(req.GetOptions(), cfg.kvHeads, cfg.headDim)
	return build.DecoderPlan(modelType, cfg.layers, cfg.kind, caches, cfg.vocab, cfg.hidden), nil
}

func (qwen3moe) Build(_ context.Context, req *pb.BuildRequest) (*pb.BuildResponse, error) {
	cfg, err := load(req.GetModel())
	if err != nil {
		return nil, err
	}
	opts, err := options(req.GetOptions())
	if err != nil {
		return nil, err
	}
	d := build.Decoder{Domain: domain, Name: "Qwen3Moe", EmbedKey: "model.embed_tokens.weight", NormKey: "model.norm.weight",
		HeadKey: cfg.lmHeadKey(), Eps: cfg.eps, RoPE: cfg.rope}
	return d.Build(req, func(dt build.DType, kind string, layers []int32) (*pb.BuildResponse, error) {
		return cfg.layer(dt, req.GetOptions(), opts[optStrategy], kind, layers)
	})
}

// options reads the plugin's options: moe_strategy gather (default) or dense.
func options(o *pb.ExportOptions) (map[string]string, error) {
	opts, err := sdk.PluginOptions(o, pluginName, map[string]string{optStrategy: build.Gather})
	if err != nil {
		return nil, err
	}
	if !slices.Contains(build.ExpertStrategies, opts[optStrategy]) {
		return nil, fmt.Errorf("moe_strategy %q: use %s or %s", opts[optStrategy], build.Gather, build.Dense)
	}
	return opts, nil
}

// config holds the config.json fields a Qwen3-MoE graph depends on.
type config struct {
	hidden, intermediate, moeIntermediate, layers int
	heads, kvHeads, headDim, vocab                int
	experts, topK, sparseStep                     int
	mlpOnly                                       []int
	normTopK, attentionBias, tied                 bool
	eps                                           float64
	rope                                          build.RoPE
	layouts                                       []expertLayout // per layer; none for dense layers
}

// load reads config.json and checks the checkpoint holds every tensor the
// graph binds, with the shape the config implies; it finds each MoE layer's
// expert layout from the keys present.
func load(m *pb.Model) (config, error) {
	cfg, err := parseConfig(m.GetConfigJson())
	if err != nil {
		return config{}, err
	}
	inv := sdk.NewInventory(m)
	cfg.layouts = make([]expertLayout, cfg.layers)
	for i := range cfg.layers {
		if cfg.kind(i) == kindMoE {
			if cfg.layouts[i], err = cfg.detectLayout(inv, int32(i)); err != nil {
				return config{}, err
			}
		}
	}
	return cfg, inv.ExpectAll(cfg.tensors())
}

func parseConfig(data []byte) (config, error) {
	c, err := hf.Parse(data)
	if err != nil {
		return config{}, err
	}
	r := hf.Reader{Config: c}
	cfg := config{
		hidden: r.Int("hidden_size"), intermediate: r.Int("intermediate_size"),
		moeIntermediate: r.Int("moe_intermediate_size"), layers: r.Int("num_hidden_layers"),
		heads: r.Int("num_attention_heads"), vocab: r.Int("vocab_size"),
		experts: r.FirstInt("num_experts", "num_local_experts"), topK: r.Int("num_experts_per_tok"),
		sparseStep: r.IntOr("decoder_sparse_step", 1), mlpOnly: r.Ints("mlp_only_layers"),
		normTopK: r.BoolOr("norm_topk_prob", false), attentionBias: r.BoolOr("attention_bias", false),
		tied: r.BoolOr("tie_word_embeddings", false), eps: r.FloatOr("rms_norm_eps", 1e-6),
	}
	act := r.StringOr("hidden_act", "silu")
	sliding := r.BoolOr("use_sliding_window", false)
	if r.Err != nil {
		return config{}, r.Err
	}
	switch {
	case act != "silu":
		return config{}, fmt.Errorf("config.json: hidden_act %q is not supported by the qwen3moe plugin (only silu)", act)
	case sliding:
		return config{}, fmt.Errorf("config.json: use_sliding_window is true; the qwen3moe plugin exports full attention only")
	case cfg.heads <= 0 || cfg.hidden <= 0 || cfg.layers <= 0 || cfg.vocab <= 0:
		return config{}, fmt.Errorf("config.json: hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be positive")
	case cfg.experts > 0 && (cfg.topK < 1 || cfg.topK > cfg.experts):
		return config{}, fmt.Errorf("config.json: num_experts_per_tok %d must be in 1..num_experts (%d)", cfg.topK, cfg.experts)
	case cfg.sparseStep < 1:
		return config{}, fmt.Errorf("config.json: decoder_sparse_step must be at least 1, got %d", cfg.sparseStep)
	}
	cfg.kvHeads = r.IntOr("num_key_value_heads", cfg.heads)
	cfg.headDim = r.IntOr("head_dim", cfg.hidden/cfg.heads)
	if r.Err != nil {
		return config{}, r.Err
	}
	if cfg.kvHeads <= 0 || cfg.heads%cfg.kvHeads != 0 {
		return config{}, fmt.Errorf("config.json: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", cfg.heads, cfg.kvHeads)
	}
	if cfg.rope, err = build.RoPEFromConfig(c, cfg.headDim); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// kind says whether layer i is a sparse MoE layer, as transformers decides.
func (c config) kind(i int) string {
	if !slices.Contains(c.mlpOnly, i) && c.experts > 0 && (i+1)%c.sparseStep == 0 {
		return kindMoE
	}
	return kindDense
}

func (c config) lmHeadKey() string {
	if c.tied {
		return "model.embed_tokens.weight"
	}
	return "lm_head.weight"
}

// tensors lists every checkpoint tensor the graph binds, with its shape.
func (c config) tensors() []sdk.ExpectedTensor {
	h, v := int64(c.hidden), int64(c.vocab)
	out := []sdk.ExpectedTensor{
		{Key: "model.embed_tokens.weight", Shape: []int64{v, h}},
		{Key: "model.norm.weight", Shape: []int64{h}},
		{Key: c.lmHeadKey(), Shape: []int64{v, h}},
	}
	for l := range c.layers {
		for _, w := range c.attentionWeights() {
			out = append(out, sdk.ExpectedTensor{Key: build.LayerKey(int32(l), w.Key), Shape: w.Shape})
		}
		if c.kind(l) == kindMoE {
			out = append(out, c.moeTensors(int32(l))...)
			continue
		}
		for _, w := range c.denseWeights() {
			out = append(out, sdk.ExpectedTensor{Key: build.LayerKey(int32(l), w.Key), Shape: w.Shape})
		}
	}
	return out
}

// attentionWeights are a layer's norms and attention weights: names below
// model.layers.<i>. (also the layer function's inputs) and shapes.
func (c config) attentionWeights() []sdk.ExpectedTensor {
	h, q, kv, hd := int64(c.hidden), int64(c.heads*c.headDim), int64(c.kvHeads*c.headDim), int64(c.headDim)
	ws := []sdk.ExpectedTensor{
		{Key: "input_layernorm.weight", Shape: []int64{h}},
		{Key: "self_attn.q_proj.weight", Shape: []int64{q, h}},
		{Key: "self_attn.k_proj.weight", Shape: []int64{kv, h}},
		{Key: "self_attn.v_proj.weight", Shape: []int64{kv, h}},
		{Key: "self_attn.o_proj.weight", Shape: []int64{h, q}},
		{Key: "self_attn.q_norm.weight", Shape: []int64{hd}},
		{Key: "self_attn.k_norm.weight", Shape: []int64{hd}},
		{Key: "post_attention_layernorm.weight", Shape: []int64{h}},
	}
	if c.attentionBias {
		ws = append(ws,
			sdk.ExpectedTensor{Key: "self_attn.q_proj.bias", Shape: []int64{q}},
			sdk.ExpectedTensor{Key: "self_attn.k_proj.bias", Shape: []int64{kv}},
			sdk.ExpectedTensor{Key: "self_attn.v_proj.bias", Shape: []int64{kv}},
			sdk.ExpectedTensor{Key: "self_attn.o_proj.bias", Shape: []int64{h}})
	}
	return ws
}

// denseWeights are a dense (mlp_only) layer's MLP weights.
func (c config) denseWeights() []sdk.ExpectedTensor {
	h, i := int64(c.hidden), int64(c.intermediate)
	return []sdk.ExpectedTensor{
		{Key: "mlp.gate_proj.weight", Shape: []int64{i, h}},
		{Key: "mlp.up_proj.weight", Shape: []int64{i, h}},
		{Key: "mlp.down_proj.weight", Shape: []int64{h, i}},
	}
}

// layer builds the decoder layer function of one kind and binds its weights
// for each of layers.
func (c config) layer(dt build.DType, opts *pb.ExportOptions, strategy, kind string, layers []int32) (*pb.BuildResponse, error) {
	name := map[string]string{kindMoE: "Qwen3MoeDecoderLayer", kindDense: "Qwen3MoeDenseDecoderLayer"}[kind]
	if name == "" {
		return nil, fmt.Errorf("qwen3moe has layer kinds %s and %s; asked for %q", kindMoE, kindDense, kind)
	}
	f := build.NewFunc(domain, name, dt)
	hidden, actx := build.LayerInputs(f, opts)
	inNorm := f.Input("input_layernorm.weight")
	attn := build.Attention{
		Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.headDim, RoPE: c.rope, NormEps: c.eps,
		Q:     build.LinearInputs(f, "self_attn.q_proj", c.attentionBias),
		K:     build.LinearInputs(f, "self_attn.k_proj", c.attentionBias),
		V:     build.LinearInputs(f, "self_attn.v_proj", c.attentionBias),
		O:     build.LinearInputs(f, "self_attn.o_proj", c.attentionBias),
		QNorm: f.Input("self_attn.q_norm.weight"), KNorm: f.Input("self_attn.k_norm.weight"),
	}
	postNorm := f.Input("post_attention_layernorm.weight")
	mlp, err := c.mlp(f, kind, strategy)
	if err != nil {
		return nil, err
	}

	normed := build.RMSNorm(f.Scope("input_layernorm"), hidden, inNorm, c.eps)
	attnOut, key, value := attn.Apply(f.Scope("self_attn"), normed, actx)
	hidden = f.Add(hidden, attnOut)
	normed = build.RMSNorm(f.Scope("post_attention_layernorm"), hidden, postNorm, c.eps)
	out, err := mlp(f.Scope("mlp"), normed)
	if err != nil {
		return nil, err
	}
	build.LayerOutputs(f, f.Add(hidden, out), key, value)

	var bindings []*pb.LayerWeights
	for _, l := range layers {
		if c.kind(int(l)) != kind {
			return nil, fmt.Errorf("layer %d is not of kind %s", l, kind)
		}
		bindings = append(bindings, c.bind(l, kind))
	}
	return build.Response(f, bindings...), nil
}

// mlp declares the layer's MLP weights and returns the block.
func (c config) mlp(f *build.Func, kind, strategy string) (func(*build.Func, build.Value) (build.Value, error), error) {
	if kind == kindDense {
		m := build.SwiGLU{
			Gate: build.LinearInputs(f, "mlp.gate_proj", false),
			Up:   build.LinearInputs(f, "mlp.up_proj", false),
			Down: build.LinearInputs(f, "mlp.down_proj", false),
		}
		return func(f *build.Func, x build.Value) (build.Value, error) { return m.Apply(f, x), nil }, nil
	}
	router := build.Router{Kind: build.SoftmaxTopK, Experts: c.experts, TopK: c.topK, Normalize: c.normTopK,
		Weight: f.Input("mlp.gate.weight")}
	experts := build.Experts{Gate: f.Input("mlp.experts.gate"), Up: f.Input("mlp.experts.up"), Down: f.Input("mlp.experts.down")}
	return func(f *build.Func, x build.Value) (build.Value, error) {
		tokens := f.Reshape(x, -1, int64(c.hidden)) // [T,H]
		w, idx, err := router.Route(f.Scope("router"), tokens)
		if err != nil {
			return "", err
		}
		y, err := experts.Apply(f.Scope("experts"), strategy, tokens, w, idx, c.experts)
		if err != nil {
			return "", err
		}
		return f.Op("Reshape", []build.Value{y, f.Shape(x)}), nil
	}, nil
}

// bind binds one layer's weights: attention and norms as stored; the MLP as
// stored (dense) or stacked/sliced into [E, H, I] and [E, I, H] (MoE).
func (c config) bind(l int32, kind string) *pb.LayerWeights {
	lw := &pb.LayerWeights{Layer: l}
	add := func(ws []sdk.ExpectedTensor) {
		for _, w := range ws {
			lw.Bindings = append(lw.Bindings, &pb.WeightBinding{Input: w.Key, Key: build.LayerKey(l, w.Key)})
		}
	}
	add(c.attentionWeights())
	if kind == kindDense {
		add(c.denseWeights())
		return lw
	}
	gate, up, down := c.layouts[l].experts(c, l)
	lw.Bindings = append(lw.Bindings,
		&pb.WeightBinding{Input: "mlp.gate.weight", Key: build.LayerKey(l, "mlp.gate.weight")},
		build.BindWeight("mlp.experts.gate", gate),
		build.BindWeight("mlp.experts.up", up),
		build.BindWeight("mlp.experts.down", down))
	return lw
}
