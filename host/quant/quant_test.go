package quant

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
	"github.com/strata-llm/strata/internal/headeronly"
)

type tensors = []headeronly.Tensor

func tensor(name, dt string, shape ...int64) headeronly.Tensor {
	return headeronly.Tensor{Name: name, DType: dt, Shape: shape}
}

// open writes a header-only checkpoint with quantization_config qc (JSON,
// "" for none) and, when given, an hf_quant_config.json.
func open(t *testing.T, qc, modelOpt string, ts tensors) *checkpoint.Checkpoint {
	t.Helper()
	dir := t.TempDir()
	cfg := `{"model_type": "llama", "architectures": ["LlamaForCausalLM"]`
	if qc != "" {
		cfg += `, "quantization_config": ` + qc
	}
	if _, err := headeronly.Write(dir, []byte(cfg+"}"), ts, 1<<40); err != nil {
		t.Fatal(err)
	}
	return openWith(t, dir, modelOpt)
}

// openIn is open for a fuzzed quantization_config: nil when the checkpoint
// reader refuses the config.json it makes.
func openIn(t *testing.T, dir, qc string, ts tensors) *checkpoint.Checkpoint {
	cfg := `{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "quantization_config": ` + qc + "}"
	if _, err := headeronly.Write(dir, []byte(cfg), ts, 1<<40); err != nil {
		t.Fatal(err)
	}
	ckpt, err := checkpoint.Open(dir)
	if err != nil {
		return nil
	}
	return ckpt
}

func openWith(t *testing.T, dir, modelOpt string) *checkpoint.Checkpoint {
	t.Helper()
	if modelOpt != "" {
		if err := os.WriteFile(filepath.Join(dir, ModelOptFile), []byte(modelOpt), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ckpt, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ckpt
}

const (
	fineFP8     = `{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}`
	ctPackW4    = `{"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed", "ignore": ["lm_head", "re:.*mlp.gate$"], "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32}}}}`
	ctPackAsy   = `{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": false, "strategy": "group", "group_size": 32}}}}`
	ctFP8Chan   = `{"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel"}}}}`
	ctFP8Dyn    = `{"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}}}`
	nvfp4Config = `{"producer": {"name": "modelopt", "version": "0.31"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}`
)

var (
	plainLinear = tensors{tensor("model.norm.weight", "BF16", 64), tensor("q.weight", "BF16", 64, 64)}
	fp8Linear   = tensors{tensor("q.weight", "F8_E4M3", 200, 130), tensor("q.weight_scale_inv", "F32", 2, 2)}
	packedW4    = tensors{tensor("q.weight_packed", "I32", 64, 8), tensor("q.weight_scale", "BF16", 64, 2), tensor("q.weight_shape", "I64", 2),
		tensor("model.layers.0.mlp.gate.weight", "BF16", 8, 64)}
	nvfp4Linear = tensors{tensor("q.weight", "U8", 64, 32), tensor("q.weight_scale", "F8_E4M3", 64, 4), tensor("q.weight_scale_2", "F32"),
		tensor("q.input_scale", "F32"), tensor("model.layers.0.self_attn.k_scale", "F32")}
)

func with(base tensors, extra ...headeronly.Tensor) tensors {
	return append(slices.Clone(base), extra...)
}

func without(base tensors, name string) tensors {
	return slices.DeleteFunc(slices.Clone(base), func(t headeronly.Tensor) bool { return t.Name == name })
}

// A reader of the weights alone (convert to float) is not refused for
// activation quantisation it does not carry: noted, its scales not weights.
func TestReadWeightsNotesActivations(t *testing.T) {
	static := strings.Replace(ctFP8Dyn, `"strategy": "token", "dynamic": true`, `"strategy": "tensor", "dynamic": false`, 1)
	ts := tensors{tensor("q.weight", "F8_E4M3", 64, 32), tensor("q.weight_scale", "BF16", 64, 1), tensor("q.input_scale", "BF16", 1)}
	if _, err := Read(open(t, static, "", ts)); err == nil {
		t.Fatal("Read accepted static activations it cannot compute")
	}
	v, err := ReadWeights(open(t, static, "", ts))
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Weights()) != 1 || !v.Auxiliary("q.input_scale") || !strings.Contains(strings.Join(v.Notes, " "), "not carried into the float weights") {
		t.Errorf("weights %v, notes %v", v.Weights(), v.Notes)
	}
	fp8Static := `{"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}`
	if _, err := ReadWeights(open(t, fp8Static, "", with(fp8Linear, tensor("q.input_scale", "F32")))); err != nil {
		t.Errorf("static FP8 activations, reading weights: %v", err)
	}
}

func TestRead(t *testing.T) {
	cases := []struct {
		name, qc, modelOpt string
		tensors            tensors
		// want: logical key -> shape and the expression, or an error.
		want    map[string]string
		wantErr string
	}{
		{name: "unquantised", tensors: plainLinear, want: map[string]string{}},
		{name: "fp8 with no config", tensors: fp8Linear, wantErr: "config.json has no quantization_config"},
		{name: "fine-grained fp8, partial blocks", qc: fineFP8, tensors: fp8Linear,
			want: map[string]string{"q.weight": "[200 130] dequant(q.weight, q.weight_scale_inv)"}},
		{name: "fine-grained fp8, fused experts", qc: fineFP8,
			tensors: tensors{tensor("e.gate_up_proj", "F8_E4M3", 4, 256, 130), tensor("e.gate_up_proj_scale_inv", "F32", 4, 2, 2)},
			want:    map[string]string{"e.gate_up_proj": "[4 256 130] dequant(e.gate_up_proj, e.gate_up_proj_scale_inv)"}},
		{name: "fine-grained fp8, a per-tensor scale beside block grids", qc: fineFP8,
			tensors: with(fp8Linear, tensor("k.weight", "F8_E4M3", 64, 32), tensor("k.weight_scale_inv", "F32")),
			want:    map[string]string{"q.weight": "[200 130] dequant(q.weight, q.weight_scale_inv)", "k.weight": "[64 32] dequant(k.weight, k.weight_scale_inv)"}},
		{name: "fine-grained fp8, a tensor sorted between weight and scale", qc: fineFP8, tensors: with(fp8Linear, tensor("q.weightA", "BF16", 2)),
			want: map[string]string{"q.weight": "[200 130] dequant(q.weight, q.weight_scale_inv)"}},
		{name: "fp8 scale missing", qc: fineFP8, tensors: without(fp8Linear, "q.weight_scale_inv"), wantErr: "q.weight_scale_inv, its scale, is missing"},
		{name: "fp8 scale of the wrong grid", qc: fineFP8, tensors: tensors{tensor("q.weight", "F8_E4M3", 200, 130), tensor("q.weight_scale_inv", "F32", 1, 1)},
			wantErr: "q.weight: dequant(q.weight, q.weight_scale_inv): scale [1 1] is not the grid of [128 128] blocks of weight [200 130] (want [2 2])"},
		{name: "orphan scale", qc: fineFP8, tensors: with(plainLinear, tensor("k.weight_scale_inv", "F32", 1, 1)), wantErr: "does not account for these quantised tensors: k.weight_scale_inv"},
		{name: "e5m2 under e4m3", qc: fineFP8, tensors: tensors{tensor("q.weight", "F8_E5M2", 128, 128), tensor("q.weight_scale_inv", "F32", 1, 1)}, wantErr: "F8_E5M2"},
		{name: "static fp8 activations", qc: `{"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}`, tensors: fp8Linear, wantErr: `activation_scheme "static" is not supported`},
		{name: "unknown method", qc: `{"quant_method": "hqq"}`, tensors: plainLinear, wantErr: `quantization_config.quant_method "hqq" is not supported`},
		{name: "no method", qc: `{"bits": 4}`, tensors: plainLinear, wantErr: "quantization_config has no quant_method"},
		{name: "compressed-tensors int4 groups", qc: ctPackW4, tensors: packedW4,
			want: map[string]string{"q.weight": "[64 64] dequant(unpack_int(q.weight_packed), q.weight_scale)"}},
		{name: "int4 scale missing", qc: ctPackW4, tensors: without(packedW4, "q.weight_scale"), wantErr: "module q is quantised (pack-quantized) but q.weight_scale, its scale, is missing"},
		{name: "int4 zero point missing", qc: ctPackAsy, tensors: packedW4, wantErr: "q.weight_zero_point, its zero point, is missing"},
		{name: "int4 with zero points", qc: ctPackAsy, tensors: with(packedW4, tensor("q.weight_zero_point", "I32", 8, 2)),
			want: map[string]string{"q.weight": "[64 64] dequant(unpack_int(q.weight_packed), q.weight_scale, unpack_int(q.weight_zero_point))"}},
		{name: "compressed-tensors fp8 per channel", qc: ctFP8Chan, tensors: tensors{tensor("q.weight", "F8_E4M3", 64, 32), tensor("q.weight_scale", "BF16", 64, 1)},
			want: map[string]string{"q.weight": "[64 32] dequant(q.weight, q.weight_scale)"}},
		{name: "channel scale of the wrong shape", qc: ctFP8Chan, tensors: tensors{tensor("q.weight", "F8_E4M3", 64, 32), tensor("q.weight_scale", "BF16", 32, 1)},
			wantErr: "scale [32 1] is not the grid of [1 32] blocks of weight [64 32] (want [64 1])"},
		{name: "tensor scale of the wrong shape", qc: strings.Replace(ctFP8Chan, "channel", "tensor", 1), tensors: tensors{tensor("q.weight", "F8_E4M3", 64, 32), tensor("q.weight_scale", "BF16", 64, 1)},
			wantErr: "scale [64 1] of per-tensor quantisation must be one value"},
		{name: "dynamic per-token activations", qc: ctFP8Dyn, tensors: tensors{tensor("q.weight", "F8_E4M3", 64, 32), tensor("q.weight_scale", "BF16", 64, 1)},
			want: map[string]string{"q.weight": "[64 32] dequant(q.weight, q.weight_scale) activations fp8_dynamic_per_token"}},
		{name: "routed experts' inputs stay float, as in transformers", qc: ctFP8Dyn,
			tensors: tensors{tensor("m.mlp.experts.3.up_proj.weight", "F8_E4M3", 64, 32), tensor("m.mlp.experts.3.up_proj.weight_scale", "BF16", 64, 1),
				tensor("m.mlp.shared_experts.up_proj.weight", "F8_E4M3", 64, 32), tensor("m.mlp.shared_experts.up_proj.weight_scale", "BF16", 64, 1)},
			want: map[string]string{"m.mlp.experts.3.up_proj.weight": "[64 32] dequant(m.mlp.experts.3.up_proj.weight, m.mlp.experts.3.up_proj.weight_scale)",
				"m.mlp.shared_experts.up_proj.weight": "[64 32] dequant(m.mlp.shared_experts.up_proj.weight, m.mlp.shared_experts.up_proj.weight_scale) activations fp8_dynamic_per_token"}},
		{name: "static activations", qc: strings.Replace(ctFP8Dyn, `"strategy": "token", "dynamic": true`, `"strategy": "tensor", "dynamic": false`, 1), tensors: packedW4,
			wantErr: "config_groups.group_0.input_activations ({\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\", \"dynamic\": false}) is not supported"},
		{name: "unknown compressed format", qc: strings.Replace(ctPackW4, `"format": "pack-quantized"`, `"format": "marlin-24"`, 1), tensors: packedW4,
			wantErr: `group_0.format "marlin-24" is not supported`},
		{name: "kv cache scheme", qc: strings.Replace(ctPackW4, `"ignore"`, `"kv_cache_scheme": {"num_bits": 8, "type": "float"}, "ignore"`, 1), tensors: packedW4,
			wantErr: "quantization_config.kv_cache_scheme is set"},
		{name: "tensor_group strategy", qc: strings.Replace(ctPackW4, `"strategy": "group"`, `"strategy": "tensor_group"`, 1), tensors: packedW4,
			wantErr: `weights.strategy "tensor_group" is not supported`},
		{name: "3-bit weights", qc: strings.Replace(ctPackW4, `"num_bits": 4`, `"num_bits": 3`, 1), tensors: packedW4, wantErr: "int 3-bit weights are not supported"},
		{name: "module no group targets", qc: strings.Replace(ctPackW4, `["Linear"]`, `["re:.*k_proj$"]`, 1), tensors: packedW4,
			wantErr: "module q holds quantised tensors but no config group"},
		{name: "ignored module holds quantised tensors", qc: strings.Replace(ctPackW4, `"lm_head", `, `"q", `, 1), tensors: packedW4,
			wantErr: "module q holds quantised tensors but no config group of quantization_config targets it (or it is in ignore)"},
		{name: "ModelOpt NVFP4", modelOpt: nvfp4Config, tensors: nvfp4Linear,
			want: map[string]string{"q.weight": "[64 64] dequant(unpack_fp4(q.weight), mul(q.weight_scale, q.weight_scale_2))"}},
		{name: "NVFP4 second scale missing", modelOpt: nvfp4Config, tensors: without(nvfp4Linear, "q.weight_scale_2"), wantErr: "q.weight_scale_2, its second-level scale, is missing"},
		{name: "NVFP4 scale grid", modelOpt: nvfp4Config, tensors: with(without(nvfp4Linear, "q.weight_scale"), tensor("q.weight_scale", "F8_E4M3", 64, 2)),
			wantErr: "scale [64 2] is not the grid of [1 16] blocks"},
		{name: "ModelOpt AWQ", modelOpt: strings.Replace(nvfp4Config, "NVFP4", "W4A16_AWQ", 1), tensors: plainLinear, wantErr: `ModelOpt quant_algo "W4A16_AWQ" is not supported`},
		{name: "ModelOpt in config.json", qc: `{"quant_method": "modelopt", "quant_algo": "FP8"}`, tensors: tensors{tensor("q.weight", "F8_E4M3", 64, 32), tensor("q.weight_scale", "F32")},
			want: map[string]string{"q.weight": "[64 32] dequant(q.weight, q.weight_scale)"}},
		{name: "gpt-oss mxfp4 is the plugin's", qc: `{"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}`,
			tensors: tensors{tensor("e.gate_up_proj_blocks", "U8", 4, 8, 2, 16), tensor("e.gate_up_proj_scales", "U8", 4, 8, 2)}, want: map[string]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Read(open(t, tc.qc, tc.modelOpt, tc.tensors))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			activations := false
			for _, w := range v.Weights() {
				got[w.Key] = fmt.Sprintf("%v %s", w.Shape, w.Dequant())
				if w.Activation != "" {
					got[w.Key] += " activations " + w.Activation
					activations = true
				}
				if w.Key == "k.weight" && tc.qc == fineFP8 && w.Dequant().Ints != nil {
					t.Errorf("k.weight's scale is one value, but it is dequantised in blocks %v", w.Dequant().Ints)
				}
			}
			if v.QuantizesActivations() != activations {
				t.Errorf("QuantizesActivations() = %v; a weight's activations are quantised: %v", v.QuantizesActivations(), activations)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("weights %v, want %v", got, tc.want)
			}
		})
	}
}

// Plugins see each quantised weight once, as float32 of its logical shape,
// and none of its stored parts; the ModelOpt activation and KV scales are
// not weights either.
func TestInventoryShowsLogicalWeights(t *testing.T) {
	ckpt := open(t, "", nvfp4Config, with(nvfp4Linear, tensor("model.norm.weight", "BF16", 64)))
	v, err := Read(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ti := range v.Inventory(ckpt) {
		got = append(got, fmt.Sprintf("%s %s %v", ti.Key, ti.Dtype, ti.Shape))
	}
	want := []string{"model.norm.weight BF16 [64]", "q.weight F32 [64 64]"}
	if !slices.Equal(got, want) {
		t.Errorf("inventory %v, want %v", got, want)
	}
	if len(v.Notes) == 0 || !strings.Contains(strings.Join(v.Notes, " "), "kv_cache_quant_algo FP8") {
		t.Errorf("notes %v: the unused KV-cache scales must be said", v.Notes)
	}
	for _, k := range []string{"q.weight_scale", "q.weight_scale_2", "q.input_scale", "model.layers.0.self_attn.k_scale"} {
		if !v.Auxiliary(k) {
			t.Errorf("%s is not reported as an auxiliary tensor", k)
		}
	}
	if v.Auxiliary("q.weight") || v.Stored("q.weight") {
		t.Error("q.weight is the logical weight, not a part")
	}
}

// Expand swaps a quantised leaf for a fresh copy of its dequantisation
// (each binding's Infer fills its own types), inside any expression, and
// leaves other leaves as they are.
func TestExpandCopies(t *testing.T) {
	v, err := Read(open(t, fineFP8, "", with(fp8Linear, tensor("k.weight", "BF16", 4, 4))))
	if err != nil {
		t.Fatal(err)
	}
	w, _ := v.Weight("q.weight")
	bound := &transform.Expr{Op: transform.OpTranspose, Ints: []int64{1, 0}, Args: []*transform.Expr{transform.Leaf("q.weight")}}
	x := v.Expand(bound)
	if got := x.String(); got != "transpose(dequant(q.weight, q.weight_scale_inv))" {
		t.Errorf("Expand = %s", got)
	}
	if y := v.Expand(bound); x.Args[0] == y.Args[0] || x.Args[0].Args[0] == y.Args[0].Args[0] || !slices.Equal(x.Args[0].Ints, w.Dequant().Ints) {
		t.Error("Expand must build a fresh dequantisation each time, not share one")
	}
	if plain := transform.Leaf("k.weight"); v.Expand(plain) != plain {
		t.Error("an unquantised leaf must stay as it is")
	}
}
