package main

import (
	"context"
	"fmt"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/build"
	"github.com/strata-llm/strata/sdk/hf"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const (
	pluginName    = "llama"
	pluginVersion = "0.1.0"
	modelType     = "llama"
	domain        = "strata.llama"
	layerKind     = "decoder"
)

type llama struct{}

var _ sdk.Architecture = llama{}

func (llama) Describe(context.Context) (*pb.DescribeResponse, error) {
	return &pb.DescribeResponse{
		Name:            pluginName,
		Version:         pluginVersion,
		ProtocolVersion: sdk.ProtocolVersion,
		SdkVersion:      sdk.Version,
		Architectures: []*pb.ArchitectureSupport{{
			ModelType:       modelType,
			HfArchitectures: []string{"LlamaForCausalLM"},
			Capabilities:    &pb.Capabilities{Layerwise: true},
		}},
	}, nil
}

func (llama) Check(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	_, err := load(req.GetModel())
	return sdk.CheckResult(err), nil
}

func (llama) Plan(_ context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error) {
	cfg, err := load(req.GetModel())
	if err != nil {
		return nil, err
	}
	if _, err := sdk.PluginOptions(req.GetOptions(), pluginName, nil); err != nil {
		return nil, err
	}
	caches := build.KVCaches(req.GetOptions(), cfg.kvHeads, cfg.headDim)
	return build.DecoderPlan(modelType, cfg.layers, func(int) string { return layerKind }, caches, cfg.vocab, cfg.hidden), nil
}

func (llama) Build(_ context.Context, req *pb.BuildRequest) (*pb.BuildResponse, error) {
	cfg, err := load(req.GetModel())
	if err != nil {
		return nil, err
	}
	d := build.Decoder{Domain: domain, Name: "Llama", EmbedKey: cfg.embeddingKey(), NormKey: "model.norm.weight",
		HeadKey: cfg.lmHeadKey(), Eps: cfg.eps, RoPE: cfg.rope}
	return d.Build(req, func(dt build.DType, kind string, layers []int32) (*pb.BuildResponse, error) {
		if kind != layerKind {
			return nil, fmt.Errorf("llama has one layer kind, %q; asked for %q", layerKind, kind)
		}
		return cfg.layer(dt, req.GetOptions(), layers), nil
	})
}

// config holds the config.json fields a Llama graph depends on.
type config struct {
	hidden, intermediate, layers int
	heads, kvHeads, headDim      int
	vocab                        int
	eps                          float64
	attentionBias, mlpBias, tied bool
	rope                         build.RoPE
}

// load reads config.json and checks the checkpoint holds every tensor the
// graph binds, with the shape the config implies.
func load(m *pb.Model) (config, error) {
	cfg, err := parseConfig(m.GetConfigJson())
	if err != nil {
		return config{}, err
	}
	return cfg, sdk.NewInventory(m).ExpectAll(cfg.tensors())
}

func parseConfig(data []byte) (config, error) {
	c, err := hf.Parse(data)
	if err != nil {
		return config{}, err
	}
	r := hf.Reader{Config: c}
	cfg := config{
		hidden:        r.Int("hidden_size"),
		intermediate:  r.Int("intermediate_size"),
		layers:        r.Int("num_hidden_layers"),
		heads:         r.Int("num_attention_heads"),
		vocab:         r.Int("vocab_size"),
		eps:           r.FloatOr("rms_norm_eps", 1e-6),
		attentionBias: r.BoolOr("attention_bias", false),
		mlpBias:       r.BoolOr("mlp_bias", false),
		tied:          r.BoolOr("tie_word_embeddings", false),
	}
	act := r.StringOr("hidden_act", "silu")
	if r.Err != nil {
		return config{}, r.Err
	}
	if act != "silu" {
		return config{}, fmt.Errorf("config.json: hidden_act %q is not supported by the llama plugin (only silu)", act)
	}
	if cfg.heads <= 0 || cfg.hidden <= 0 || cfg.layers <= 0 || cfg.vocab <= 0 || cfg.intermediate <= 0 {
		return config{}, fmt.Errorf("config.json: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and vocab_size must be positive")
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

func (c config) embeddingKey() string { return "model.embed_tokens.weight" }

func (c config) lmHeadKey() string {
	if c.tied {
		return c.embeddingKey()
	}
	return "lm_head.weight"
}

// tensors lists every checkpoint tensor the graph binds, with its shape.
func (c config) tensors() []sdk.ExpectedTensor {
	h, v := int64(c.hidden), int64(c.vocab)
	out := []sdk.ExpectedTensor{
		{Key: c.embeddingKey(), Shape: []int64{v, h}},
		{Key: "model.norm.weight", Shape: []int64{h}},
		{Key: c.lmHeadKey(), Shape: []int64{v, h}},
	}
	for l := range c.layers {
		for _, w := range c.layerWeights() {
			out = append(out, sdk.ExpectedTensor{Key: build.LayerKey(int32(l), w.Key), Shape: w.Shape})
		}
	}
	return out
}

// layerWeights are a decoder layer's weights: names below model.layers.<i>.
// (also the layer function's formal inputs) and shapes.
func (c config) layerWeights() []sdk.ExpectedTensor {
	h, i := int64(c.hidden), int64(c.intermediate)
	q, kv := int64(c.heads*c.headDim), int64(c.kvHeads*c.headDim)
	ws := []sdk.ExpectedTensor{
		{Key: "input_layernorm.weight", Shape: []int64{h}},
		{Key: "self_attn.q_proj.weight", Shape: []int64{q, h}},
		{Key: "self_attn.k_proj.weight", Shape: []int64{kv, h}},
		{Key: "self_attn.v_proj.weight", Shape: []int64{kv, h}},
		{Key: "self_attn.o_proj.weight", Shape: []int64{h, q}},
		{Key: "post_attention_layernorm.weight", Shape: []int64{h}},
		{Key: "mlp.gate_proj.weight", Shape: []int64{i, h}},
		{Key: "mlp.up_proj.weight", Shape: []int64{i, h}},
		{Key: "mlp.down_proj.weight", Shape: []int64{h, i}},
	}
	if c.attentionBias {
		ws = append(ws,
			sdk.ExpectedTensor{Key: "self_attn.q_proj.bias", Shape: []int64{q}},
			sdk.ExpectedTensor{Key: "self_attn.k_proj.bias", Shape: []int64{kv}},
			sdk.ExpectedTensor{Key: "self_attn.v_proj.bias", Shape: []int64{kv}},
			sdk.ExpectedTensor{Key: "self_attn.o_proj.bias", Shape: []int64{h}})
	}
	if c.mlpBias {
		ws = append(ws,
			sdk.ExpectedTensor{Key: "mlp.gate_proj.bias", Shape: []int64{i}},
			sdk.ExpectedTensor{Key: "mlp.up_proj.bias", Shape: []int64{i}},
			sdk.ExpectedTensor{Key: "mlp.down_proj.bias", Shape: []int64{h}})
	}
	return ws
}

func (c config) layer(dt build.DType, opts *pb.ExportOptions, layers []int32) *pb.BuildResponse {
	f := build.NewFunc(domain, "LlamaDecoderLayer", dt)
	hidden, actx := build.LayerInputs(f, opts)
	inNorm := f.Input("input_layernorm.weight")
	attn := build.Attention{
		Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.headDim, RoPE: c.rope,
		Q: build.LinearInputs(f, "self_attn.q_proj", c.attentionBias),
		K: build.LinearInputs(f, "self_attn.k_proj", c.attentionBias),
		V: build.LinearInputs(f, "self_attn.v_proj", c.attentionBias),
		O: build.LinearInputs(f, "self_attn.o_proj", c.attentionBias),
	}
	postNorm := f.Input("post_attention_layernorm.weight")
	mlp := build.SwiGLU{
		Gate: build.LinearInputs(f, "mlp.gate_proj", c.mlpBias),
		Up:   build.LinearInputs(f, "mlp.up_proj", c.mlpBias),
		Down: build.LinearInputs(f, "mlp.down_proj", c.mlpBias),
	}

	normed := build.RMSNorm(f.Scope("input_layernorm"), hidden, inNorm, c.eps)
	attnOut, key, value := attn.Apply(f.Scope("self_attn"), normed, actx)
	hidden = f.Add(hidden, attnOut)
	normed = build.RMSNorm(f.Scope("post_attention_layernorm"), hidden, postNorm, c.eps)
	hidden = f.Add(hidden, mlp.Apply(f.Scope("mlp"), normed))

	build.LayerOutputs(f, hidden, key, value)

	var bindings []*pb.LayerWeights
	for _, l := range layers {
		lw := &pb.LayerWeights{Layer: l}
		for _, w := range c.layerWeights() {
			lw.Bindings = append(lw.Bindings, &pb.WeightBinding{Input: w.Key, Key: build.LayerKey(l, w.Key)})
		}
		bindings = append(bindings, lw)
	}
	return build.Response(f, bindings...)
}
