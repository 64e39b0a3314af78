package headeronly

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Quantised releases. A generator lists a checkpoint's tensors unquantised;
// quantize rewrites that list as config.json's quantization_config stores
// it: each quantised Linear weight in its stored dtype, followed by its
// scale (Write keeps the two in one shard). One pass for every architecture.

// quantizedProjections are the Linear modules quantised releases store
// quantised, under a decoder layer (model.layers.<l>.,
// model.language_model.layers.<l>.): attention and dense, per-expert and
// shared-expert MLP projections. Norms, routers (mlp.gate), embeddings, the
// head, vision towers and MTP glue (eh_proj) stay in the checkpoint dtype,
// and so does every module modules_to_not_convert or ignore names.
var quantizedProjections = []string{
	"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
	"self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj", // MLA
	"gate_proj", "up_proj", "down_proj",
}

var decoderLayer = regexp.MustCompile(`(^|\.)layers\.[0-9]+\.`)

// quantSchemes maps a quant_method to how its weights are stored; nil: the
// architecture's generator lists them as stored (gpt-oss's MXFP4 experts).
var quantSchemes = map[string]func(q quantConfig, dt string) (quantScheme, error){
	"fp8":                fineGrainedFP8,
	"compressed-tensors": compressedFP8,
	"mxfp4":              nil,
}

// quantScheme is how a release stores a quantised Linear weight [out, in]:
// the weight's dtype, and its scale: key suffix, dtype and shape.
type quantScheme struct {
	weight      string
	scaleSuffix string // X.weight + suffix: X.weight_scale_inv, X.weight_scale
	scaleDType  string
	scaleShape  func(out, in int64) []int64
	excluded    []string // modules kept unquantised
}

// quantConfig holds the quantization_config fields the schemes read.
type quantConfig struct {
	Method     string   `json:"quant_method"`
	Fmt        string   `json:"fmt"`
	Activation string   `json:"activation_scheme"`
	Block      []int64  `json:"weight_block_size"`
	NotConvert []string `json:"modules_to_not_convert"`
	Format     string   `json:"format"`
	Ignore     []string `json:"ignore"`
	Groups     map[string]struct {
		Targets []string `json:"targets"`
		Format  string   `json:"format"`
		Weights *struct {
			NumBits        int     `json:"num_bits"`
			Type           string  `json:"type"`
			Strategy       string  `json:"strategy"`
			BlockStructure []int64 `json:"block_structure"`
		} `json:"weights"`
		Input *struct {
			Dynamic any `json:"dynamic"`
		} `json:"input_activations"`
	} `json:"config_groups"`
}

// quantize rewrites ts as configJSON's quantization_config (top level, or
// in text_config as multimodal releases nest it) stores them; ts unchanged
// when there is none. dt is the checkpoint dtype.
func quantize(configJSON []byte, dt string, ts []Tensor) ([]Tensor, error) {
	var top struct {
		Quant *quantConfig `json:"quantization_config"`
		Text  struct {
			Quant *quantConfig `json:"quantization_config"`
		} `json:"text_config"`
	}
	if err := json.Unmarshal(configJSON, &top); err != nil {
		return nil, fmt.Errorf("config.json: quantization_config: %w", err)
	}
	q := top.Quant
	if q == nil {
		q = top.Text.Quant
	}
	if q == nil {
		return ts, nil
	}
	scheme, ok := quantSchemes[q.Method]
	if ok && scheme == nil {
		return ts, nil
	}
	if !ok {
		return nil, fmt.Errorf("config.json: quantization_config.quant_method %q: headeronly writes fp8 (fine-grained, block scales), compressed-tensors (float 8-bit) and, through its generator, gpt-oss's mxfp4", q.Method)
	}
	s, err := scheme(*q, dt)
	if err != nil {
		return nil, fmt.Errorf("config.json: quantization_config (%s): %w", q.Method, err)
	}
	skip, err := newModuleSet(s.excluded)
	if err != nil {
		return nil, fmt.Errorf("config.json: quantization_config: %w", err)
	}
	out := make([]Tensor, 0, len(ts)+len(ts)/2)
	for _, t := range ts {
		module, ok := strings.CutSuffix(t.Name, ".weight")
		if !ok || len(t.Shape) != 2 || !quantizable(module) || skip.match(module) {
			out = append(out, t)
			continue
		}
		out = append(out, Tensor{t.Name, s.weight, []int64{t.Shape[0], t.Shape[1]}},
			Tensor{t.Name + s.scaleSuffix, s.scaleDType, s.scaleShape(t.Shape[0], t.Shape[1])})
	}
	return out, nil
}

func quantizable(module string) bool {
	if !decoderLayer.MatchString(module) {
		return false
	}
	for _, p := range quantizedProjections {
		if strings.HasSuffix(module, "."+p) {
			return true
		}
	}
	return false
}

// fineGrainedFP8 is transformers' FineGrainedFP8: an F8_E4M3 weight and an
// F32 weight_scale_inv per weight_block_size block, the grid ceil-divided.
func fineGrainedFP8(q quantConfig, _ string) (quantScheme, error) {
	if q.Fmt != "" && q.Fmt != "e4m3" {
		return quantScheme{}, fmt.Errorf("fmt %q: headeronly writes e4m3", q.Fmt)
	}
	if q.Activation != "" && q.Activation != "dynamic" {
		return quantScheme{}, fmt.Errorf("activation_scheme %q: headeronly writes no activation scales", q.Activation)
	}
	if len(q.Block) != 2 || q.Block[0] <= 0 || q.Block[1] <= 0 {
		return quantScheme{}, fmt.Errorf("weight_block_size %v: headeronly writes block scales, such as [128, 128]", q.Block)
	}
	bm, bn := q.Block[0], q.Block[1]
	return quantScheme{weight: "F8_E4M3", scaleSuffix: "_scale_inv", scaleDType: "F32",
		scaleShape: func(out, in int64) []int64 { return []int64{ceilDiv(out, bm), ceilDiv(in, bn)} },
		excluded:   q.NotConvert}, nil
}

// compressedFP8 is compressed-tensors' float-quantized format with one
// config group of 8-bit float weights targeting Linear: an F8_E4M3 weight
// and a weight_scale in the checkpoint dtype (as llm-compressor saves it)
// per tensor, output channel or block. Dynamic activation quantisation
// stores nothing; static would store input scales, which are not written.
func compressedFP8(q quantConfig, dt string) (quantScheme, error) {
	if len(q.Groups) != 1 {
		return quantScheme{}, fmt.Errorf("%d config groups: headeronly writes one", len(q.Groups))
	}
	var name string
	for n := range q.Groups {
		name = n
	}
	g := q.Groups[name]
	w, format := g.Weights, g.Format
	if format == "" {
		format = q.Format
	}
	switch {
	case len(g.Targets) != 1 || g.Targets[0] != "Linear":
		return quantScheme{}, fmt.Errorf("config_groups.%s.targets %v: headeronly writes [Linear]", name, g.Targets)
	case format != "float-quantized" || w == nil || w.Type != "float" || w.NumBits != 8:
		return quantScheme{}, fmt.Errorf("config_groups.%s: headeronly writes float-quantized 8-bit float weights", name)
	case g.Input != nil && g.Input.Dynamic != true:
		return quantScheme{}, fmt.Errorf("config_groups.%s.input_activations: static activation scales are not written", name)
	}
	s := quantScheme{weight: "F8_E4M3", scaleSuffix: "_scale", scaleDType: dt, excluded: q.Ignore}
	switch w.Strategy {
	case "tensor":
		s.scaleShape = func(int64, int64) []int64 { return []int64{1} }
	case "channel":
		s.scaleShape = func(out, _ int64) []int64 { return []int64{out, 1} }
	case "block":
		b := w.BlockStructure
		if len(b) != 2 || b[0] <= 0 || b[1] <= 0 {
			return quantScheme{}, fmt.Errorf("config_groups.%s.weights.block_structure %v: want two positive sizes", name, b)
		}
		s.scaleShape = func(out, in int64) []int64 { return []int64{ceilDiv(out, b[0]), ceilDiv(in, b[1])} }
	default:
		return quantScheme{}, fmt.Errorf("config_groups.%s.weights.strategy %q: headeronly writes tensor, channel and block", name, w.Strategy)
	}
	return s, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// moduleSet matches module names as the quantisers' exclusion lists do:
// "re:" patterns from the name's start (compressed-tensors' ignore), other
// entries naming the module, a module it is under, or a trailing part of
// its name ("lm_head", "model.layers.3.mlp.gate", "mlp.gate"), at dots.
type moduleSet struct {
	names map[string]bool
	res   []*regexp.Regexp
}

func newModuleSet(patterns []string) (moduleSet, error) {
	s := moduleSet{names: map[string]bool{}}
	for _, p := range patterns {
		re, ok := strings.CutPrefix(p, "re:")
		if !ok {
			s.names[p] = true
			continue
		}
		r, err := regexp.Compile("^(?:" + re + ")")
		if err != nil {
			return s, fmt.Errorf("excluded module pattern %q: %w", p, err)
		}
		s.res = append(s.res, r)
	}
	return s, nil
}

func (s moduleSet) match(m string) bool {
	if s.names[m] {
		return true
	}
	for i := range len(m) {
		if m[i] == '.' && (s.names[m[:i]] || s.names[m[i+1:]]) {
			return true
		}
	}
	for _, r := range s.res {
		if r.MatchString(m) {
			return true
		}
	}
	return false
}
