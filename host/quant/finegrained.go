package quant

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
)

// fineGrainedFP8 reads quant_method "fp8" (transformers' FineGrainedFP8, as
// DeepSeek-V3, Qwen3-*-FP8, GLM-4.x-FP8 and MiniMax-M2 ship): an F8_E4M3
// weight and an F32 <weight>_scale_inv per weight_block_size block (per
// expert, fused or not). The scale grid is ceil-divided: edge blocks may be
// partial, as the quantiser and vLLM's kernels treat them.
//
// Activations: "dynamic" quantises them per token group on a GPU kernel
// only; transformers on CPU dequantises the weights and computes in float,
// and so does the export.
func (r *resolver) fineGrainedFP8(cfg config) error {
	if f := cfg.str("fmt"); f != "" && f != "e4m3" {
		return fmt.Errorf("quantization_config.fmt %q is not supported: fine-grained FP8 checkpoints strata reads store e4m3", f)
	}
	static := false
	if a := cfg.str("activation_scheme"); a != "" && a != "dynamic" {
		err := fmt.Errorf("quantization_config.activation_scheme %q is not supported: static FP8 activation scales change the math, and only \"dynamic\" (computed in float when dequantised, as transformers does on CPU) is", a)
		if err := r.unsupportedActivations(err); err != nil {
			return err
		}
		static = true
	}
	var block []int64
	if raw := cfg["weight_block_size"]; !isNull(raw) {
		if err := json.Unmarshal(raw, &block); err != nil || len(block) != 2 || block[0] <= 0 || block[1] <= 0 {
			return fmt.Errorf("quantization_config.weight_block_size %s: want two positive sizes, such as [128, 128]", raw)
		}
	}
	excluded, err := rawStrings(cfg["modules_to_not_convert"])
	if err != nil {
		return fmt.Errorf("quantization_config.modules_to_not_convert: %w", err)
	}
	r.view.Excluded = excluded
	r.view.Format = "fine-grained FP8 (E4M3 weights, float32 weight_scale_inv per tensor)"
	if block != nil {
		r.view.Format = fmt.Sprintf("fine-grained FP8 (E4M3 weights, float32 weight_scale_inv per %d×%d block)", block[0], block[1])
	}
	if cfg.str("activation_scheme") == "dynamic" {
		r.view.Notes = append(r.view.Notes, "activation_scheme dynamic: activations stay in the compute dtype (transformers dequantises FP8 weights on CPU and does the same)")
	}
	// One dequantizer (a comparable pointer) for every weight with a block
	// grid, one for those with a per-tensor scale.
	blocked, perTensor := &blockFP8{block}, &blockFP8{}
	tensors := r.ckpt.Sorted()
	for i, t := range tensors {
		k := t.Key
		if t.DType != "F8_E4M3" {
			if t.DType == "F8_E5M2" {
				return fmt.Errorf("tensor %s is F8_E5M2, but quantization_config (fp8) says e4m3", k)
			}
			continue
		}
		scale, ok := r.scaleOf(tensors, i)
		if !ok {
			return fmt.Errorf("tensor %s is FP8 but %s, its scale, is missing from the checkpoint", k, k+fp8ScaleSuffix)
		}
		how := blocked
		if isScalar(scale) {
			how = perTensor
		} else if block == nil {
			return fmt.Errorf("tensor %s has a block grid, but quantization_config has no weight_block_size: strata cannot tell the block", scale.Key)
		}
		if err := r.add(k, how, "", t, scale); err != nil {
			return err
		}
	}
	for _, t := range tensors {
		k := t.Key
		if base, ok := strings.CutSuffix(k, ".input_scale"); ok && r.view.Has(base+".weight") {
			if static {
				r.hide(k, "static activation scale")
				continue
			}
			return fmt.Errorf("tensor %s is a static activation scale, which fine-grained FP8 with dynamic activations does not have; strata does not apply static activation scales", k)
		}
	}
	return nil
}

// fp8ScaleSuffix names a fine-grained FP8 weight's scale: weight ->
// weight_scale_inv, gate_up_proj -> gate_up_proj_scale_inv.
const fp8ScaleSuffix = "_scale_inv"

// scaleOf is the scale of the FP8 tensor sorted[i]: in sorted order it
// nearly always comes next (looking it up was a sixth of reading
// Kimi-K2's 69,000 FP8 experts).
func (r *resolver) scaleOf(sorted []*checkpoint.Tensor, i int) (*checkpoint.Tensor, bool) {
	key := sorted[i].Key
	if i+1 < len(sorted) {
		next := sorted[i+1].Key
		if len(next) == len(key)+len(fp8ScaleSuffix) && strings.HasPrefix(next, key) && strings.HasSuffix(next, fp8ScaleSuffix) {
			return sorted[i+1], true
		}
	}
	return r.tensor(key + fp8ScaleSuffix)
}

// blockFP8 dequantises an FP8 weight with its <weight>_scale_inv, one per
// block of the block size, or (block nil) one for the tensor.
type blockFP8 struct{ block []int64 }

func (b blockFP8) expr(_ *checkpoint.Checkpoint, key string) *transform.Expr {
	return dequant(b.block, transform.Leaf(key), transform.Leaf(key+fp8ScaleSuffix))
}

// isScalar: the tensor is one value of rank below 2 (a per-tensor scale);
// a [1, 1] grid is still checked against the block size.
func isScalar(t *checkpoint.Tensor) bool { return t.Elements() == 1 && len(t.Shape) < 2 }
