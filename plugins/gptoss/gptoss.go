package gptoss

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

const (
	kindSliding = "sliding"
	kindFull    = "full"
	// ctxSlidingMask is the context value of the sliding layers' mask.
	ctxSlidingMask = "sliding_mask"
)

// plugin is gpt-oss, as transformers' modeling_gpt_oss.py computes it:
// biased q/k/v/o, a learned sink logit per head joining each softmax, yarn
// RoPE, sliding-window attention on the layers layer_types names
// sliding_attention (full attention on the others), a top-k → softmax
// router with a bias, and experts with biases and a clamped SwiGLU, stored
// MXFP4 (the Hub release) or dequantised (what transformers saves).
var plugin = decoder.Plugin{Name: "gptoss", Version: "0.1.0", Architectures: []decoder.Architecture{{
	ModelType: "gpt_oss", HFArchitectures: []string{"GptOssForCausalLM"}, Name: "GptOss",
	Capabilities: &pb.Capabilities{Layerwise: true, ExpertLayouts: []string{"mxfp4", "fused-interleaved"},
		QuantizedFormats: []string{"mxfp4"}},
	Options:  []*pb.PluginOption{decoder.MoEStrategyOption()},
	Defaults: defaults,
	Load:     load,
}}}

// defaults are GptOssConfig's where they differ from the common decoder's:
// head_dim 64 (not hidden/heads), num_key_value_heads 8 (not the heads),
// rms_norm_eps 1e-5, rope_theta 150000 (its default_theta), and, when
// config.json names no rope settings, its yarn rope (factor 32, beta_fast
// 32, beta_slow 1, truncate false, original 4096; rope_parameters, when
// present, is read instead).
var defaults = map[string]any{
	"head_dim": 64, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 150000,
	"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 32, "beta_fast": 32, "beta_slow": 1,
		"truncate": false, "original_max_position_embeddings": 4096},
}

// config holds gpt-oss's own config.json fields.
type config struct {
	experts, topK, intermediate int
	window                      int    // sliding_window (0: no sliding layer)
	sliding                     []bool // per layer
	act                         blocks.ClampedSwiGLU
	layouts                     map[int32]expertLayout // per layer, found from the keys
}

func load(m *decoder.Model) error {
	c := config{experts: m.FirstInt("num_local_experts", "num_experts"), topK: m.Int("num_experts_per_tok"),
		intermediate: m.Intermediate}
	bias := m.BoolOr("attention_bias", true)
	if m.Err != nil {
		return m.Err
	}
	var err error
	if c.act, err = blocks.ClampedSwiGLUFromConfig(m.Config); err != nil {
		return err
	}
	switch {
	case c.experts < 1:
		return fmt.Errorf("config.json: num_local_experts must be positive, got %d", c.experts)
	case c.topK < 1 || c.topK > c.experts:
		return fmt.Errorf("config.json: num_experts_per_tok %d must be in 1..num_local_experts (%d)", c.topK, c.experts)
	}
	if err := c.readLayerTypes(m); err != nil {
		return err
	}
	if err := quantMethod(m); err != nil {
		return err
	}
	c.layouts = map[int32]expertLayout{}
	if err := m.EveryLayer(func(i int32) (err error) {
		c.layouts[i], err = c.detectLayout(m, i)
		return err
	}); err != nil {
		return err
	}
	m.KindOf = func(i int) string {
		if c.sliding[i] {
			return kindSliding
		}
		return kindFull
	}
	body := func(mask string) func(l *decoder.Layer) error {
		return func(l *decoder.Layer) error {
			attention := &decoder.Attention{QKVBias: bias, OBias: bias, Sinks: true, Mask: mask}
			return l.PreNorm(attention, &moe{config: c, strategy: m.Options[decoder.MoEStrategy]})
		}
	}
	m.Kind(kindFull, "GptOssDecoderLayer", body(""))
	if c.window > 0 {
		m.AddContext(decoder.SlidingWindow(ctxSlidingMask, c.window))
		m.Kind(kindSliding, "GptOssSlidingDecoderLayer", body(ctxSlidingMask))
		m.Note("sliding_attention layers keep a ctx_len KV cache like the others, masked to the last %d positions", c.window)
	}
	return nil
}

// readLayerTypes reads layer_types (one of sliding_attention or
// full_attention per layer; when absent transformers' default: layer i
// slides when i+1 is odd) and sliding_window, which the sliding layers need.
func (c *config) readLayerTypes(m *decoder.Model) error {
	types := m.Strings("layer_types")
	if m.Err != nil {
		return m.Err
	}
	c.sliding = make([]bool, m.Layers)
	if types == nil {
		for i := range c.sliding {
			c.sliding[i] = (i+1)%2 == 1
		}
	} else if len(types) != m.Layers {
		return fmt.Errorf("config.json: layer_types has %d entries; num_hidden_layers is %d", len(types), m.Layers)
	}
	for i, t := range types {
		switch t {
		case "sliding_attention":
			c.sliding[i] = true
		case "full_attention":
		default:
			return fmt.Errorf("config.json: layer_types[%d] is %q; gpt-oss layers are sliding_attention or full_attention", i, t)
		}
	}
	if !slices.Contains(c.sliding, true) {
		return nil
	}
	if !m.Config.Has("sliding_window") {
		if types == nil {
			return fmt.Errorf("config.json: sliding_window is missing (or null), but layer_types names sliding_attention layers (it is absent: transformers' default makes every even layer sliding)")
		}
		return fmt.Errorf("config.json: sliding_window is missing (or null), but layer_types names sliding_attention layers")
	}
	if c.window = m.Int("sliding_window"); m.Err != nil {
		return m.Err
	}
	if c.window < 1 {
		return fmt.Errorf("config.json: sliding_window must be positive, got %d", c.window)
	}
	return nil
}

// quantMethod refuses a quantization_config other than MXFP4 (the release's).
func quantMethod(m *decoder.Model) error {
	q, ok := m.Object("quantization_config")
	if !ok {
		return m.Err
	}
	method, err := q.StringOr("quant_method", "")
	if err != nil {
		return err
	}
	if method != "mxfp4" {
		return fmt.Errorf("config.json: quantization_config.quant_method %q is not supported by the gptoss plugin (mxfp4 only)", method)
	}
	return nil
}

// moe is gpt-oss's MLP: the router (logits with a bias, top-k, softmax over
// the k), then the chosen experts (biases, clamped SwiGLU), each expert's
// output, down bias included, weighed by its routing weight.
type moe struct {
	config
	strategy string
	router   blocks.Router
	run      blocks.Experts
}

func (b *moe) Declare(l *decoder.Layer) {
	e, h := int64(b.experts), int64(l.Model.Hidden)
	b.router = blocks.Router{Kind: blocks.TopKSoftmax, Experts: b.experts, TopK: b.topK,
		Weight: l.Weight("mlp.router.weight", e, h), Bias: l.Weight("mlp.router.bias", e)}
	part := func(name string, p expertPart) fn.Value {
		return l.Computed(name, func(i int32) weightExpr { return b.layouts[i].expr(b.config, l.Model, i, p) })
	}
	b.run = blocks.Experts{
		Gate: part("mlp.experts.gate", gateW), Up: part("mlp.experts.up", upW), Down: part("mlp.experts.down", downW),
		GateBias: part("mlp.experts.gate_bias", gateB), UpBias: part("mlp.experts.up_bias", upB),
		DownBias: part("mlp.experts.down_bias", downB), Activation: b.act.Activation,
	}
}

func (b *moe) Apply(l *decoder.Layer, f *fn.Func, x fn.Value) (fn.Value, error) {
	return decoder.RoutedExperts(f, x, l.Model.Hidden, b.router, "router", b.run, b.strategy)
}
