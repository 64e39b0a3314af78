package convert

import (
	"fmt"
	"slices"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
)

// Quantisation schemes.
const (
	QuantNone       = "none"
	QuantFP8Block   = "fp8-block"   // E4M3 + weight_scale_inv per 128×128 block (transformers FineGrainedFP8)
	QuantFP8Dynamic = "fp8-dynamic" // compressed-tensors FP8_DYNAMIC: per-channel weight_scale, dynamic per-token activations
)

// blockSize is the fp8-block weight block.
const blockSize = 128

// Kinds of group.
const (
	kindCopy      = "copy"           // bytes as stored
	kindCast      = "cast"           // float to float
	kindFP8       = "fp8_dequant"    // FP8 weight × its scale, to a float type
	kindMXFP4     = "mxfp4_dequant"  // gpt-oss blocks + E8M0 scales, to a float type
	kindQuantBlk  = "quantize_block" // to E4M3 + per-block scale_inv
	kindQuantChan = "quantize_channel"
)

// group is what produces one output tensor (and its scale, when
// quantised) from one or two source tensors.
type group struct {
	Layer   int // decoder layer, -1 for the tail
	Kind    string
	Outputs []checkpoint.Entry
	src     *source // the tensor read
	scale   *source // FP8 scale or MXFP4 scales
	// dequant: how the FP8 scale grid maps onto the weight
	blockRows, blockCols int64
	// the float type the rows are written in (cast, dequant), or the
	// scale's type (quantize_channel)
	outDT     string
	transpose bool // MXFP4 experts: [E, R, C] -> [E, C, R], as transformers lays gpt-oss experts out
	quantize  string
}

// accounting is what happened to one source tensor.
type accounting struct {
	Key     string   `json:"key"`
	File    string   `json:"file"`
	DType   string   `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Action  string   `json:"action"` // copied, cast, dequantized, quantized, dropped
	Outputs []string `json:"outputs,omitempty"`
	Into    string   `json:"into,omitempty"` // the shard holding the outputs
	Reason  string   `json:"reason,omitempty"`
	MTP     bool     `json:"mtp,omitempty"`
}

// plan is the whole conversion, computed from the headers alone.
type plan struct {
	inv        *inventory
	mtp        *MTP
	opts       Options
	groups     []*group
	byLayer    map[int][]*group // -1: tail
	layers     []int            // decoder layers with tensors, sorted
	accounts   map[string]*accounting
	exclusions []string // modules not quantised (names, then MTP prefixes), when quantising
}

func (p *plan) quantizing() bool {
	return p.opts.Quantize == QuantFP8Block || p.opts.Quantize == QuantFP8Dynamic
}

// dequantizing: quantised sources are decoded (a dtype or a quantisation
// was asked); otherwise everything is carried as stored.
func (p *plan) dequantizing() bool { return p.opts.DType != "" || p.quantizing() }

func makePlan(inv *inventory, mtp *MTP, opts Options) (*plan, error) {
	p := &plan{inv: inv, mtp: mtp, opts: opts, byLayer: map[int][]*group{}, accounts: map[string]*accounting{}}
	for _, k := range inv.keys {
		s := inv.tensors[k]
		p.accounts[k] = &accounting{Key: k, File: s.Shard, DType: s.DType, Shape: shapeOf(s.Shape), MTP: mtp.IsMTP(k)}
	}
	done := map[string]bool{}
	for _, k := range inv.keys {
		if done[k] {
			continue
		}
		if err := p.planKey(k, done); err != nil {
			return nil, err
		}
	}
	if err := p.checkOutputs(); err != nil {
		return nil, err
	}
	for _, g := range p.groups {
		p.byLayer[g.Layer] = append(p.byLayer[g.Layer], g)
	}
	for l := range p.byLayer {
		if l >= 0 {
			p.layers = append(p.layers, l)
		}
	}
	slices.Sort(p.layers)
	if p.quantizing() {
		p.exclusions = p.exclusionList()
	}
	return p, nil
}

func shapeOf(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

func (p *plan) add(g *group, primary string) {
	g.Layer, _ = layerOf(primary)
	p.groups = append(p.groups, g)
}

// targetDT is the float type a tensor of dtype dt is written in when it is
// not quantised: --dtype, else its own type; quantised sources decode to
// bfloat16 unless --dtype says otherwise.
func (p *plan) targetDT(dt string) string {
	switch p.opts.DType {
	case "bfloat16":
		return "BF16"
	case "float16":
		return "F16"
	case "float32":
		return "F32"
	}
	if isFloat(dt) {
		return dt
	}
	return "BF16"
}

func (p *plan) planKey(k string, done map[string]bool) error {
	inv := p.inv
	s := inv.tensors[k]
	acc := p.accounts[k]
	done[k] = true
	if base, ok := cutAny(k, ".input_scale", ".activation_scale"); ok && p.dequantizing() {
		if w, ok := inv.tensors[base+".weight"]; ok && isFP8(w.DType) {
			p.dropActivationScale(k)
			return nil
		}
	}
	// MXFP4 pair (gpt-oss): X_blocks U8 [..., R, G, 16] + X_scales U8 [..., R, G].
	if base, ok := strings.CutSuffix(k, "_blocks"); ok && p.dequantizing() && s.DType == "U8" {
		if sc, ok := inv.tensors[base+"_scales"]; ok {
			return p.planMXFP4(base, s, sc, done)
		}
	}
	if isFP8(s.DType) && p.dequantizing() {
		return p.planFP8(k, s, done)
	}
	if isFloat(s.DType) {
		if p.quantizing() && p.quantizable(k, s) {
			return p.planQuant(k, s, nil, 0, 0, done)
		}
		out := p.targetDT(s.DType)
		if out != s.DType {
			p.add(&group{Kind: kindCast, src: s, outDT: out, Outputs: []checkpoint.Entry{{Name: k, DType: out, Shape: s.Shape}}}, k)
			acc.Action, acc.Outputs = "cast", []string{k}
			acc.Reason = fmt.Sprintf("%s to %s", s.DType, out)
			return nil
		}
	} else if p.dequantizing() {
		switch s.DType {
		case "U8", "I8", "F4", "F8_E8M0", "F8_E4M3", "F8_E5M2":
			return fmt.Errorf("tensor %s (%s %v in %s) cannot be converted as asked: it is neither a float tensor nor part of a quantised pair strata knows (FP8 weight + weight_scale_inv or weight_scale, MXFP4 *_blocks + *_scales); convert without --dtype and --quantize to carry it as stored", k, s.DType, s.Shape, s.Shard)
		}
		acc.Reason = "not a float tensor: carried as stored"
	}
	p.add(&group{Kind: kindCopy, src: s, Outputs: []checkpoint.Entry{{Name: k, DType: s.DType, Shape: s.Shape}}}, k)
	acc.Action, acc.Outputs = "copied", []string{k}
	return nil
}

func (p *plan) planMXFP4(base string, blocks, scales *source, done map[string]bool) error {
	r := len(blocks.Shape)
	if r < 2 || blocks.Shape[r-1] != 16 || !slices.Equal(blocks.Shape[:r-1], scales.Shape) {
		return fmt.Errorf("MXFP4 tensors %s %v and %s %v: blocks must be [..., G, 16] and scales [..., G]", blocks.Key, blocks.Shape, scales.Key, scales.Shape)
	}
	if scales.DType != "U8" && scales.DType != "F8_E8M0" {
		return fmt.Errorf("MXFP4 scales %s are %s; they must be U8 or F8_E8M0 exponents", scales.Key, scales.DType)
	}
	done[scales.Key] = true
	shape := slices.Clone(blocks.Shape[:r-1])
	shape[r-2] *= 32
	g := &group{Kind: kindMXFP4, src: blocks, scale: scales, outDT: p.targetDT("")}
	how := "mxfp4_dequant"
	if len(shape) == 3 { // gpt-oss experts [E, out, in] -> transformers' [E, in, out]
		g.transpose = true
		shape[1], shape[2] = shape[2], shape[1]
		how += " then transpose(1, 2), as transformers lays gpt-oss experts out"
	}
	g.Outputs = []checkpoint.Entry{{Name: base, DType: g.outDT, Shape: shape}}
	p.add(g, base)
	a := p.accounts[blocks.Key]
	a.Action, a.Outputs, a.Reason = "dequantized", []string{base}, fmt.Sprintf("%s to %s", how, g.outDT)
	b := p.accounts[scales.Key]
	b.Action, b.Reason = "dropped", "MXFP4 scales, folded into the dequantised "+base
	return nil
}

// fp8Scale finds the scale of an FP8 weight: X_scale_inv (block-scaled
// releases), or for X = M.weight, M.weight_scale (compressed-tensors,
// ModelOpt), or X_scale.
func (p *plan) fp8Scale(k string) *source {
	for _, name := range []string{k + "_scale_inv", k + "_scale"} {
		if s, ok := p.inv.tensors[name]; ok {
			return s
		}
	}
	return nil
}

func (p *plan) planFP8(k string, w *source, done map[string]bool) error {
	sc := p.fp8Scale(k)
	if sc == nil {
		return fmt.Errorf("FP8 tensor %s (%s %v in %s) has no scale (%s_scale_inv or %s_scale): it cannot be dequantised; convert without --dtype and --quantize to carry it as stored, or restore the scales", k, w.DType, w.Shape, w.Shard, k, k)
	}
	bm, bn, err := p.scaleGrid(w, sc)
	if err != nil {
		return err
	}
	done[sc.Key] = true
	b := p.accounts[sc.Key]
	b.Action, b.Reason = "dropped", "scale of the FP8 source, folded into the dequantised "+k
	// Static activation scales of the quantised module mean nothing once
	// its weight is dequantised.
	mod := moduleOf(k)
	for _, name := range []string{mod + ".input_scale", mod + ".activation_scale"} {
		if _, ok := p.accounts[name]; ok && !done[name] {
			done[name] = true
			p.dropActivationScale(name)
		}
	}
	if p.quantizing() && p.quantizable(k, w) {
		return p.planQuant(k, w, sc, bm, bn, done)
	}
	out := p.targetDT("")
	p.add(&group{Kind: kindFP8, src: w, scale: sc, blockRows: bm, blockCols: bn, outDT: out,
		Outputs: []checkpoint.Entry{{Name: k, DType: out, Shape: w.Shape}}}, k)
	a := p.accounts[k]
	a.Action, a.Outputs, a.Reason = "dequantized", []string{k}, fmt.Sprintf("fp8_dequant with %s to %s", sc.Key, out)
	return nil
}

// scaleGrid says how many weight rows and columns one scale element covers.
func (p *plan) scaleGrid(w, sc *source) (int64, int64, error) {
	r := len(w.Shape)
	if sc.Elements() == 1 {
		rows, cols := int64(1), int64(1)
		if r >= 2 {
			rows, cols = w.Shape[r-2], w.Shape[r-1]
		} else if r == 1 {
			cols = w.Shape[0]
		}
		return max(rows, 1), max(cols, 1), nil
	}
	bad := fmt.Errorf("FP8 scale %s %v does not fit weight %s %v (expected a per-tensor scalar, per-channel [out, 1], or a block grid): it cannot be dequantised", sc.Key, sc.Shape, w.Key, w.Shape)
	if r < 2 || len(sc.Shape) != r || !slices.Equal(sc.Shape[:r-2], w.Shape[:r-2]) {
		return 0, 0, bad
	}
	rows, cols, sr, scn := w.Shape[r-2], w.Shape[r-1], sc.Shape[r-2], sc.Shape[r-1]
	if sr == 0 || scn == 0 {
		return 0, 0, bad
	}
	grid := func(n, s int64, declared int64) (int64, bool) {
		if declared > 0 && (n+declared-1)/declared == s {
			return declared, true
		}
		if n%s == 0 {
			return n / s, true
		}
		return 0, false
	}
	bs := p.sourceBlock()
	bm, ok1 := grid(rows, sr, bs[0])
	bn, ok2 := grid(cols, scn, bs[1])
	if !ok1 || !ok2 {
		return 0, 0, bad
	}
	return bm, bn, nil
}

// sourceBlock is the source's quantization_config.weight_block_size, or 0s.
func (p *plan) sourceBlock() [2]int64 {
	qc, _ := p.inv.config["quantization_config"].(map[string]any)
	ws, _ := qc["weight_block_size"].([]any)
	var out [2]int64
	if len(ws) == 2 {
		for i, v := range ws {
			if n, ok := v.(interface{ Int64() (int64, error) }); ok {
				out[i], _ = n.Int64()
			}
		}
	}
	return out
}

// quantizable: a Linear weight of a decoder layer that is not MTP, a
// router, a norm or an embedding. Everything else stays in its float type.
func (p *plan) quantizable(k string, s *source) bool {
	if p.mtp.IsMTP(k) || len(s.Shape) != 2 || !strings.HasSuffix(k, ".weight") {
		return false
	}
	if l, _ := layerOf(k); l < 0 {
		return false
	}
	return !neverQuantized(moduleOf(k))
}

// neverQuantized: routers (mlp.gate, mlp.router, shared_expert_gate),
// norms, embeddings and heads.
func neverQuantized(module string) bool {
	last := module[strings.LastIndexByte(module, '.')+1:]
	switch last {
	case "gate", "router", "shared_expert_gate", "lm_head", "head":
		return true
	}
	return strings.Contains(last, "norm") || strings.Contains(last, "embed")
}

func (p *plan) planQuant(k string, s, sc *source, bm, bn int64, done map[string]bool) error {
	rows, cols := s.Shape[0], s.Shape[1]
	g := &group{src: s, scale: sc, blockRows: bm, blockCols: bn, quantize: p.opts.Quantize}
	a := p.accounts[k]
	from := s.DType
	if sc != nil {
		from = "FP8 dequantised with " + sc.Key
	}
	switch p.opts.Quantize {
	case QuantFP8Block:
		g.Kind = kindQuantBlk
		g.Outputs = []checkpoint.Entry{
			{Name: k, DType: "F8_E4M3", Shape: s.Shape},
			{Name: k + "_scale_inv", DType: "F32", Shape: []int64{ceilDiv(rows, blockSize), ceilDiv(cols, blockSize)}},
		}
		a.Reason = fmt.Sprintf("%s to E4M3 with a float32 weight_scale_inv per %d×%d block", from, blockSize, blockSize)
	default:
		g.Kind = kindQuantChan
		g.outDT = p.targetDT(s.DType)
		g.Outputs = []checkpoint.Entry{
			{Name: k, DType: "F8_E4M3", Shape: s.Shape},
			{Name: moduleOf(k) + ".weight_scale", DType: g.outDT, Shape: []int64{rows, 1}},
		}
		a.Reason = fmt.Sprintf("%s to E4M3 with a per-output-channel %s weight_scale", from, g.outDT)
	}
	p.add(g, k)
	a.Action = "quantized"
	for _, e := range g.Outputs {
		a.Outputs = append(a.Outputs, e.Name)
	}
	return nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// checkOutputs refuses two groups writing one name (e.g. a dequantised
// X_blocks onto an existing X).
func (p *plan) checkOutputs() error {
	seen := map[string]string{}
	for _, g := range p.groups {
		for _, e := range g.Outputs {
			if prev, dup := seen[e.Name]; dup {
				return fmt.Errorf("output tensor %s would be written from both %s and %s: the source holds both a quantised and a plain copy of it", e.Name, prev, g.src.Key)
			}
			seen[e.Name] = g.src.Key
		}
	}
	return nil
}

// exclusionList names, from the checkpoint, every module that is not
// quantised although a quantiser could target it: Linear-shaped weights
// left in float (routers, embeddings, lm_head), norms, fused expert tensors,
// then the MTP prefixes (whose modules are not listed one by one).
func (p *plan) exclusionList() []string {
	quantized := map[string]bool{}
	for _, g := range p.groups {
		if g.quantize != "" {
			quantized[moduleOf(g.src.Key)] = true
		}
	}
	names := map[string]bool{}
	for _, g := range p.groups {
		if g.quantize != "" {
			continue
		}
		e := g.Outputs[0]
		mod := moduleOf(e.Name)
		if p.mtp.IsMTP(g.src.Key) || quantized[mod] {
			continue
		}
		switch {
		case strings.HasSuffix(e.Name, ".weight") && (len(e.Shape) == 2 || strings.Contains(mod[strings.LastIndexByte(mod, '.')+1:], "norm")):
			names[mod] = true
		case len(e.Shape) == 3 && strings.HasSuffix(mod, ".experts"):
			names[mod] = true
		}
	}
	// With tied embeddings lm_head has no tensor of its own, but the module
	// exists and shares the (unquantised) embedding: a quantiser that
	// targets every Linear would quantise it and find no scale.
	if _, ok := p.inv.tensors["lm_head.weight"]; !ok {
		names["lm_head"] = true
	}
	out := sortedKeys(names)
	for _, pre := range p.mtp.Prefixes {
		if p.opts.Quantize == QuantFP8Dynamic {
			// compressed-tensors matches names exactly or "re:" regexes.
			out = append(out, `re:^`+strings.ReplaceAll(pre, ".", `\.`)+`\.`)
		} else {
			out = append(out, pre)
		}
	}
	return out
}

func (p *plan) dropActivationScale(key string) {
	a := p.accounts[key]
	a.Action, a.Reason = "dropped", "activation scale of the FP8 source module "+moduleOf(key)+": meaningless once its weight is dequantised"
}

func cutAny(s string, suffixes ...string) (string, bool) {
	for _, x := range suffixes {
		if b, ok := strings.CutSuffix(s, x); ok {
			return b, true
		}
	}
	return s, false
}
