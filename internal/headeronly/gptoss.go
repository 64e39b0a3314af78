package headeronly

import "fmt"

// gptOssShape holds the config.json fields that decide a gpt-oss
// checkpoint's tensor shapes.
type gptOssShape struct {
	decoderShape
	intermediate, experts int
}

// GptOssTensors lists the tensors a GptOssForCausalLM checkpoint of
// configJSON holds as the Hub releases store them: experts MXFP4 (U8
// *_blocks [E, N, K/32, 16] and *_scales [E, N, K/32], N the output rows,
// gate/up rows interleaved), their biases and everything else in dt;
// attention always biased, one sink logit per head.
func GptOssTensors(configJSON []byte, dt string) ([]Tensor, error) {
	d, r, err := parseDecoder(configJSON, dt)
	if err != nil {
		return nil, err
	}
	d.attentionBias = r.BoolOr("attention_bias", true)
	s := gptOssShape{decoderShape: d, intermediate: r.Int("intermediate_size"),
		experts: r.FirstInt("num_local_experts", "num_experts")}
	if r.Err != nil {
		return nil, r.Err
	}
	if s.intermediate <= 0 || s.intermediate%32 != 0 || s.Hidden%32 != 0 || s.experts <= 0 {
		return nil, fmt.Errorf("config.json: MXFP4 experts need positive intermediate_size (%d), hidden_size (%d) multiples of 32 and experts (%d)",
			s.intermediate, s.Hidden, s.experts)
	}
	return s.tensors(dt, func(_ int, prefix string) []Tensor { return s.layer(prefix, dt) }), nil
}

// layer lists one GptOssDecoderLayer's tensors in module order.
func (s gptOssShape) layer(prefix, dt string) []Tensor {
	h, i, e := int64(s.Hidden), int64(s.intermediate), int64(s.experts)
	out := append(s.attention(prefix, dt), Tensor{prefix + "self_attn.sinks", dt, []int64{int64(s.Heads)}})
	out = append(out, linear(prefix+"mlp.router", dt, e, h, true)...)
	mx := func(name string, rows, cols int64) []Tensor {
		return []Tensor{
			{prefix + "mlp.experts." + name + "_blocks", "U8", []int64{e, rows, cols / 32, 16}},
			{prefix + "mlp.experts." + name + "_scales", "U8", []int64{e, rows, cols / 32}},
			{prefix + "mlp.experts." + name + "_bias", dt, []int64{e, rows}},
		}
	}
	out = append(out, mx("gate_up_proj", 2*i, h)...)
	out = append(out, mx("down_proj", h, i)...)
	return append(out, s.norms(prefix, dt)...)
}
