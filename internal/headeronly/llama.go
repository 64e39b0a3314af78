package headeronly

import "fmt"

// llamaShape holds the config.json fields that decide a Llama checkpoint's
// tensor shapes.
type llamaShape struct {
	decoderShape
	intermediate int
	mlpBias      bool
}

// LlamaTensors lists the tensors a LlamaForCausalLM checkpoint of
// configJSON holds, all of safetensors dtype dt, in the order save_pretrained
// writes its state dict (which decides the shard split).
func LlamaTensors(configJSON []byte, dt string) ([]Tensor, error) {
	d, r, err := parseDecoder(configJSON, dt)
	if err != nil {
		return nil, err
	}
	s := llamaShape{decoderShape: d, intermediate: r.Int("intermediate_size"), mlpBias: r.BoolOr("mlp_bias", false)}
	if r.Err != nil {
		return nil, r.Err
	}
	if s.intermediate <= 0 {
		return nil, fmt.Errorf("config.json: intermediate_size must be positive, got %d", s.intermediate)
	}
	return s.tensors(dt, func(_ int, prefix string) []Tensor { return s.layer(prefix, dt) }), nil
}

// layer lists one decoder layer's tensors in LlamaDecoderLayer's module
// order (self_attn, mlp, then the norms), each bias after its weight.
func (s llamaShape) layer(prefix, dt string) []Tensor {
	out := s.attention(prefix, dt)
	out = append(out, gatedMLP(prefix+"mlp.", dt, int64(s.Hidden), int64(s.intermediate), s.mlpBias)...)
	return append(out, s.norms(prefix, dt)...)
}
