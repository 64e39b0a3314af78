package quant

import (
	"testing"
)

// FuzzRead: whatever quantization_config a checkpoint carries, Read
// refuses it or reads it; it never panics.
func FuzzRead(f *testing.F) {
	for _, seed := range []string{fineFP8, ctPackW4, ctPackAsy, ctFP8Chan, ctFP8Dyn, `{"quant_method": "modelopt", "quant_algo": "NVFP4"}`,
		`{"quant_method": "compressed-tensors", "config_groups": {"group_0": null}}`, `{"quant_method": "fp8", "weight_block_size": [0, 1]}`,
		`{"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["re:("], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}}}`} {
		f.Add(seed)
	}
	ts := with(with(packedW4, fp8Linear...), nvfp4Linear[2:]...)
	f.Fuzz(func(t *testing.T, qc string) {
		dir := t.TempDir()
		ckpt := openIn(t, dir, qc, ts)
		if ckpt == nil {
			return // not a config.json the checkpoint reader accepts
		}
		v, err := Read(ckpt)
		if err == nil {
			for _, w := range v.Weights() {
				if _, err := v.Typed(w); err != nil {
					t.Fatalf("Read accepted %s, whose expression does not type: %v", w.Key, err)
				}
			}
		}
	})
}
