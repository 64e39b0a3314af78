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

// Context values computed once per model and passed to every layer.
const (
	ctxCos         = "cos"
	ctxSin         = "sin"
	ctxMask        = "mask"
	ctxReadIndices = "cache_read_indices"
	ctxReadInvalid = "cache_read_invalid"
	pastKey        = "past_key"
	pastValue      = "past_value"
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
	if _, err := load(req.GetModel()); err != nil {
		return &pb.CheckResponse{Reasons: []string{err.Error()}}, nil
	}
	return &pb.CheckResponse{Supported: true, LayerwiseSupported: true}, nil
}

func (llama) Plan(_ context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error) {
	cfg, err := load(req.GetModel())
	if err != nil {
		return nil, err
	}
	plan := &pb.PlanResponse{
		ModelType:      modelType,
		Kinds:          []*pb.LayerKind{{Name: layerKind, Caches: cfg.caches(req.GetOptions())}},
		ContextOutputs: []string{ctxCos, ctxSin, ctxMask, ctxReadIndices, ctxReadInvalid},
		VocabSize:      int64(cfg.vocab),
		HiddenSize:     int64(cfg.hidden),
	}
	for i := range cfg.layers {
		plan.Layers = append(plan.Layers, &pb.Layer{Index: int32(i), Kind: layerKind})
	}
	return plan, nil
}

func (llama) Build(_ context.Context, req *pb.BuildRequest) (*pb.BuildResponse, error) {
	cfg, err := load(req.GetModel())
	if err != nil {
		return nil, err
	}
	dt, err := build.ComputeDType(req.GetOptions())
	if err != nil {
		return nil, err
	}
	switch req.GetPart() {
	case sdk.PartEmbed:
		return cfg.embed(dt), nil
	case sdk.PartContext:
		return cfg.context(dt, req.GetOptions()), nil
	case sdk.PartLayer:
		if req.GetKind() != layerKind {
			return nil, fmt.Errorf("llama has one layer kind, %q; asked for %q", layerKind, req.GetKind())
		}
		return cfg.layer(dt, req.GetOptions(), req.GetLayers()), nil
	case sdk.PartFinal:
		return cfg.final(dt), nil
	default:
		return nil, fmt.Errorf("llama has no part %q", req.GetPart())
	}
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

// caches are the KV cache: batch_size rows, or full_batch_size with
// continuous batching.
func (c config) caches(opts *pb.ExportOptions) []*pb.CacheSpec {
	rows := "batch_size"
	if opts.GetContinuousBatching() {
		rows = "full_batch_size"
	}
	shape := []*pb.Dim{build.DimParam(rows), build.DimSize(c.kvHeads), build.DimParam("ctx_len"), build.DimSize(c.headDim)}
	return []*pb.CacheSpec{{Name: pastKey, Shape: shape}, {Name: pastValue, Shape: shape}}
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
			out = append(out, sdk.ExpectedTensor{Key: layerKey(l, w.Key), Shape: w.Shape})
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

func layerKey(layer int, name string) string {
	return fmt.Sprintf("model.layers.%d.%s", layer, name)
}

func (c config) embed(dt build.DType) *pb.BuildResponse {
	f := build.NewFunc(domain, "LlamaEmbed", dt)
	ids, table := f.Input(sdk.InputIDs), f.Input("embed_tokens.weight")
	f.Output(sdk.HiddenStates, build.Embedding(f, table, ids))
	return build.Response(f, build.Bind(sdk.NonLayer, "embed_tokens.weight", c.embeddingKey()))
}

func (c config) context(dt build.DType, opts *pb.ExportOptions) *pb.BuildResponse {
	f := build.NewFunc(domain, "LlamaContext", dt)
	pos, cache := f.Input(sdk.PositionIDs), f.Input(pastKey)
	var ccl build.Value
	if opts.GetCcl() {
		ccl = f.Input(sdk.CompCtxLengths)
	}
	cos, sin := c.rope.Tables(f.Scope("rope"), pos)
	slots := build.CacheSlots(f.Scope("cache"), cache, ccl)
	indices, invalid := build.CacheReadIndices(f.Scope("cache"), pos, slots)
	f.Output(ctxCos, cos)
	f.Output(ctxSin, sin)
	f.Output(ctxMask, build.CausalMask(f.Scope("mask"), pos, slots))
	f.Output(ctxReadIndices, indices)
	f.Output(ctxReadInvalid, invalid)
	return build.Response(f)
}

func (c config) layer(dt build.DType, opts *pb.ExportOptions, layers []int32) *pb.BuildResponse {
	f := build.NewFunc(domain, "LlamaDecoderLayer", dt)
	hidden, pos := f.Input(sdk.HiddenStates), f.Input(sdk.PositionIDs)
	var batchIndex build.Value
	if opts.GetContinuousBatching() {
		batchIndex = f.Input(sdk.BatchIndex)
	}
	actx := build.AttentionContext{
		BatchIndex:  batchIndex,
		PositionIDs: pos,
		PastKey:     f.Input(pastKey), PastValue: f.Input(pastValue),
		Cos: f.Input(ctxCos), Sin: f.Input(ctxSin), Mask: f.Input(ctxMask),
		ReadIndices: f.Input(ctxReadIndices), Invalid: f.Input(ctxReadInvalid),
	}
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

	f.Output(sdk.HiddenStatesOut, hidden)
	f.Output(pastKey+sdk.RetainedSuffix, key)
	f.Output(pastValue+sdk.RetainedSuffix, value)

	var bindings []*pb.LayerWeights
	for _, l := range layers {
		lw := &pb.LayerWeights{Layer: l}
		for _, w := range c.layerWeights() {
			lw.Bindings = append(lw.Bindings, &pb.WeightBinding{Input: w.Key, Key: layerKey(int(l), w.Key)})
		}
		bindings = append(bindings, lw)
	}
	return build.Response(f, bindings...)
}

func (c config) final(dt build.DType) *pb.BuildResponse {
	f := build.NewFunc(domain, "LlamaFinal", dt)
	hidden, pos := f.Input(sdk.HiddenStates), f.Input(sdk.PositionIDs)
	norm, head := f.Input("norm.weight"), f.Input("lm_head.weight")
	last := build.LastValidToken(f, hidden, pos)
	logits := build.Linear{Weight: head}.Apply(f.Scope("lm_head"), build.RMSNorm(f.Scope("norm"), last, norm, c.eps))
	f.Output(sdk.Logits, f.CastTo(logits, dt, build.Float32))
	return build.Response(f, build.Bind(sdk.NonLayer,
		"norm.weight", "model.norm.weight",
		"lm_head.weight", c.lmHeadKey()))
}
