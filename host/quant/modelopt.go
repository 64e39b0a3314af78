package quant

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
)

// ModelOpt's quantisation algorithms strata reads.
const (
	moFP8   = "FP8"
	moNVFP4 = "NVFP4"
)

// modelOptConfig turns hf_quant_config.json ({"producer": ..., "quantization":
// {"quant_algo", "group_size", "exclude_modules", "kv_cache_quant_algo"}})
// into a quantization_config of quant_method "modelopt".
func modelOptConfig(data []byte) (config, error) {
	var file struct {
		Producer     json.RawMessage `json:"producer"`
		Quantization config          `json:"quantization"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", ModelOptFile, err)
	}
	if file.Quantization == nil {
		return nil, fmt.Errorf("%s has no \"quantization\" object: strata cannot tell how the weights are quantised", ModelOptFile)
	}
	cfg := config{"quant_method": json.RawMessage(`"modelopt"`)}
	for k, v := range file.Quantization {
		cfg[k] = v
	}
	return cfg, nil
}

// modelOpt reads NVIDIA ModelOpt exports: NVFP4 (U8 weight of two E2M1
// codes a byte, F8_E4M3 weight_scale per group of 16, F32 weight_scale_2)
// and FP8 (F8_E4M3 weight, F32 weight_scale per tensor or channel).
//
// Their input_scale (static activation quantisation) is not applied: the
// export computes activations in float, as vLLM's weight-only kernels for
// these formats (Marlin W4A16 / W8A16) do on GPUs without FP4/FP8 units.
func (r *resolver) modelOpt(cfg config) error {
	if inner, ok := cfg["quantization"]; ok { // config.json may nest hf_quant_config's object
		var q config
		if err := json.Unmarshal(inner, &q); err == nil {
			for k, v := range q {
				cfg[k] = v
			}
		}
	}
	algo := cfg.str("quant_algo")
	var group int64 = 16
	if raw := cfg["group_size"]; !isNull(raw) {
		if err := json.Unmarshal(raw, &group); err != nil || group <= 0 {
			return fmt.Errorf("quantization_config.group_size %s: want a positive group size", raw)
		}
	}
	list := cfg["exclude_modules"]
	if isNull(list) { // config.json's form names them "ignore"
		list = cfg["ignore"]
	}
	excluded, err := rawStrings(list)
	if err != nil {
		return fmt.Errorf("quantization_config.exclude_modules: %w", err)
	}
	r.view.Excluded = excluded
	switch algo {
	case moNVFP4:
		r.view.Format = fmt.Sprintf("ModelOpt NVFP4 (E2M1 weights, E4M3 weight_scale per group of %d, float32 weight_scale_2)", group)
	case moFP8:
		r.view.Format = "ModelOpt FP8 (E4M3 weights, float32 weight_scale)"
	default:
		return fmt.Errorf("ModelOpt quant_algo %q is not supported: strata reads %s and %s", algo, moFP8, moNVFP4)
	}
	if kv := cfg.str("kv_cache_quant_algo"); kv != "" {
		r.view.Notes = append(r.view.Notes, fmt.Sprintf("kv_cache_quant_algo %s: the KV cache stays in the compute dtype (its k_scale/v_scale are not applied, as vLLM's default kv_cache_dtype \"auto\" does)", kv))
	}
	for _, k := range r.ckpt.Keys() {
		switch {
		case strings.HasSuffix(k, ".input_scale"):
			r.hide(k, "static activation scale: activations are computed in float (weight-only)")
		case strings.HasSuffix(k, ".k_scale"), strings.HasSuffix(k, ".v_scale"):
			r.hide(k, "KV-cache scale: the cache stays in the compute dtype")
		}
	}
	if hidden := len(r.view.hidden); hidden > 0 {
		r.view.Notes = append(r.view.Notes, fmt.Sprintf("%d activation and KV-cache scales are not applied: weight-only dequantisation, as vLLM's Marlin kernels compute on GPUs without native %s", hidden, algo))
	}
	for _, k := range r.ckpt.Keys() {
		m, ok := strings.CutSuffix(k, ".weight_scale")
		if !ok {
			continue
		}
		if err := r.modelOptModule(m, algo, group); err != nil {
			return err
		}
	}
	return nil
}

func (r *resolver) modelOptModule(m, algo string, group int64) error {
	key, scale := m+".weight", m+".weight_scale"
	w, ok := r.tensor(key)
	if !ok {
		return fmt.Errorf("tensor %s is a weight scale but %s is missing from the checkpoint", scale, key)
	}
	switch algo {
	case moNVFP4:
		if w.DType != "U8" {
			return fmt.Errorf("tensor %s is %s, but NVFP4 weights are U8 bytes of two E2M1 codes", key, w.DType)
		}
		scale2 := m + ".weight_scale_2"
		if _, ok := r.tensor(scale2); !ok {
			return fmt.Errorf("module %s is NVFP4 but %s, its second-level scale, is missing from the checkpoint", m, scale2)
		}
		return r.add(key, nvfp4{group}, "")
	default:
		if w.DType != "F8_E4M3" {
			return fmt.Errorf("tensor %s is %s, but ModelOpt FP8 weights are F8_E4M3", key, w.DType)
		}
		return r.add(key, modelOptFP8{}, "")
	}
}

// nvfp4 dequantises E2M1 codes with their E4M3 group scales times the
// second-level scale: e2m1 · (s · s₂), the scales multiplied first as
// ModelOpt's dequantiser does.
type nvfp4 struct{ group int64 }

func (n nvfp4) expr(_ *checkpoint.Checkpoint, key string) *transform.Expr {
	m := strings.TrimSuffix(key, ".weight")
	combined := &transform.Expr{Op: transform.OpMul, Args: []*transform.Expr{transform.Leaf(m + ".weight_scale"), transform.Leaf(m + ".weight_scale_2")}}
	codes := &transform.Expr{Op: transform.OpUnpackFP4, Args: []*transform.Expr{transform.Leaf(key)}}
	return dequant([]int64{1, n.group}, codes, combined)
}

// modelOptFP8 dequantises an FP8 weight with its weight_scale: one value,
// or one per output channel ([out] or [out, 1]).
type modelOptFP8 struct{}

func (modelOptFP8) expr(c *checkpoint.Checkpoint, key string) *transform.Expr {
	scale := strings.TrimSuffix(key, ".weight") + ".weight_scale"
	st, _ := c.Tensor(scale)
	w, _ := c.Tensor(key)
	if st.Elements() == 1 {
		return dequant(nil, transform.Leaf(key), transform.Leaf(scale))
	}
	grid := &transform.Expr{Op: transform.OpReshape, Args: []*transform.Expr{transform.Leaf(scale)}, Ints: []int64{st.Elements(), 1}}
	return dequant([]int64{1, w.Shape[len(w.Shape)-1]}, transform.Leaf(key), grid)
}
