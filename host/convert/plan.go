package convert

import (
	"fmt"
	"slices"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/quant"
	"github.com/strata-llm/strata/host/weights/transform"
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
	kindFP8       = "fp8_dequant"    // FP8 weight × its scale, to a float type, streamed
	kindDequant   = "dequant"        // a quantised weight computed by its quant.View expression, to a float type
	kindMXFP4     = "mxfp4_dequant"  // gpt-oss blocks + E8M0 scales, to a float type
	kindQuantBlk  = "quantize_block" // to E4M3 + per-block scale_inv
	kindQuantChan = "quantize_channel"
)

// group is what produces one output tensor (and its scale, when
// quantised) from one or two source tensors, or from a quantised weight's
// stored parts.
type group struct {
	Layer   int // decoder layer, -1 for the tail
	Kind    string
	Outputs []checkpoint.Entry
	src     *source // the tensor read (of a quantised weight: its stored values)
	scale   *source // FP8 scale or MXFP4 scales
	// FP8 dequant: the scale's shape as the dequantisation reads it (the
	// View's reshape of a per-channel [out] scale), and how its grid maps
	// onto the weight
	scaleShape           []int64
	blockRows, blockCols int64
	// weight: a quantised weight that is not a plain FP8 × scale, computed
	// whole by Eval of its View expression (typed when it is written: a plan
	// of a large release holds no expression trees), from read.
	weight *quant.Weight
	view   *quant.View
	read   transform.Reader
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
	// view is the source's quantisation (host/quant), read when dequantising.
	view *quant.View
}

// viewDriven: the source's quantised weights are planned from the View
// (every format host/quant reads), not by name (gpt-oss MXFP4, which its
// plugin dequantises, keeps convert's own planning).
func (p *plan) viewDriven() bool { return p.view.Quantized() && !p.view.PluginHandled }

func (p *plan) quantizing() bool {
	return p.opts.Quantize == QuantFP8Block || p.opts.Quantize == QuantFP8Dynamic
}

// dequantizing: quantised sources are decoded (a dtype, a quantisation or
// --quantize none was asked); otherwise everything is carried as stored.
func (p *plan) dequantizing() bool {
	return p.opts.DType != "" || p.quantizing() || p.opts.Quantize == QuantNone
}

func makePlan(inv *inventory, mtp *MTP, opts Options) (*plan, error) {
	p := &plan{inv: inv, mtp: mtp, opts: opts, byLayer: map[int][]*group{}, accounts: map[string]*accounting{}}
	for _, k := range inv.keys {
		s := inv.tensors[k]
		p.accounts[k] = &accounting{Key: k, File: s.Shard, DType: s.DType, Shape: shapeOf(s.Shape), MTP: mtp.IsMTP(k)}
	}
	done := map[string]bool{}
	if p.dequantizing() {
		view, err := quant.ReadWeights(inv.ckpt)
		if err != nil {
			return nil, fmt.Errorf("cannot dequantise %s: %w (without --dtype and --quantize, convert carries a checkpoint as stored)", inv.dir, err)
		}
		p.view = view
	}
	// A quantised weight is planned where its first stored part comes in
	// key order, as every other group: a shard lays its tensors out in
	// plan order, so an FP8 source converts to the bytes it always did.
	partOf := map[string]*quant.Weight{}
	if p.viewDriven() {
		for _, w := range p.view.Weights() {
			for _, k := range w.Dequant().Keys() {
				partOf[k] = w
			}
		}
	}
	for _, k := range inv.keys {
		var err error
		switch w := partOf[k]; {
		case done[k]:
			continue
		case w != nil:
			err = p.planWeight(w, done)
		case p.viewDriven() && p.view.Stored(k):
			done[k] = true
			p.dropStored(k)
		default:
			err = p.planKey(k, done)
		}
		if err != nil {
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
	// MXFP4 pair (gpt-oss): X_blocks U8 [..., R, G, 16] + X_scales U8 [..., R, G].
	if base, ok := strings.CutSuffix(k, "_blocks"); ok && p.dequantizing() && s.DType == "U8" {
		if sc, ok := inv.tensors[base+"_scales"]; ok {
			return p.planMXFP4(base, s, sc, done)
		}
	}
	if isFloat(s.DType) {
		if p.quantizing() && p.quantizable(k, s.Shape) {
			p.planQuant(k, &group{src: s}, s.Shape, s.DType)
			return nil
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
			return fmt.Errorf("tensor %s (%s %v in %s) cannot be converted as asked: it is neither a float tensor nor part of a quantised weight strata reads (quantization_config fp8, compressed-tensors or modelopt; gpt-oss MXFP4 *_blocks + *_scales); convert without --dtype and --quantize to carry it as stored", k, s.DType, s.Shape, s.Shard)
		}
		acc.Reason = "not a float tensor: carried as stored"
	}
	p.add(&group{Kind: kindCopy, src: s, Outputs: []checkpoint.Entry{{Name: k, DType: s.DType, Shape: s.Shape}}}, k)
	acc.Action, acc.Outputs = "copied", []string{k}
	return nil
}

// planWeight plans a quantised weight of the View: one output under its
// logical key, dequantised by its expression (then cast, or re-quantised);
// its stored parts are consumed, never copied.
func (p *plan) planWeight(w *quant.Weight, done map[string]bool) error {
	expr, err := p.view.Typed(w)
	if err != nil {
		return err
	}
	keys := expr.Keys()
	vals, ok := p.inv.tensors[keys[0]]
	if !ok {
		return fmt.Errorf("quantised weight %s: tensor %s is not in the source", w.Key, keys[0])
	}
	for _, k := range keys {
		done[k] = true
	}
	how := "dequantised as " + expr.String()
	g := &group{src: vals}
	if sc, shape, bm, bn, ok := p.plainFP8(expr); ok {
		// FP8 × scale: streamed in rows by the FP8 kernel, which gives
		// Eval's bits (TestFP8KernelGivesTheViewsBits).
		g.scale, g.scaleShape, g.blockRows, g.blockCols = sc, shape, bm, bn
	} else {
		g.weight, g.view, g.read = w, p.view, p.inv.read
	}
	a := p.accounts[vals.Key]
	// MTP membership is the stored tensors' (a packed weight's logical key
	// is none of them).
	if p.quantizing() && !p.mtp.IsMTP(vals.Key) && p.quantizable(w.Key, w.Shape) {
		p.planQuant(w.Key, g, w.Shape, how)
	} else {
		g.Kind, g.outDT = kindDequant, p.targetDT("")
		if g.weight == nil {
			g.Kind = kindFP8
		}
		g.Outputs = []checkpoint.Entry{{Name: w.Key, DType: g.outDT, Shape: w.Shape}}
		p.add(g, w.Key)
		a.Action, a.Outputs, a.Reason = "dequantized", []string{w.Key}, fmt.Sprintf("%s to %s", how, g.outDT)
		if w.Activation != "" {
			a.Reason += fmt.Sprintf("; the source also quantised its layer's inputs (%s), which a float checkpoint does not", w.Activation)
		}
	}
	for _, k := range keys[1:] {
		b := p.accounts[k]
		b.Action, b.Reason = "dropped", fmt.Sprintf("%s of the quantised %s, folded into its dequantisation", partRole(expr, k), w.Key)
	}
	return nil
}

// dropStored accounts for a stored tensor of the View that is part of no
// weight's expression: a packed weight's stored shape, or an activation or
// KV-cache scale the View does not apply.
func (p *plan) dropStored(k string) {
	a := p.accounts[k]
	a.Action = "dropped"
	if w := moduleOf(k) + ".weight"; strings.HasSuffix(k, ".weight_shape") {
		if p.view.Has(w) {
			a.Reason = "stored shape of the packed " + w + ", which its dequantisation has"
			return
		}
	}
	a.Reason = fmt.Sprintf("activation or KV-cache scale of the %s source: not applied (weight-only dequantisation), and meaningless once the weights are float", p.view.Method)
}

// plainFP8 recognises a View expression the FP8 kernel computes: an FP8
// weight times a float scale (one value, or a grid over its last two axes,
// maybe reshaped: ModelOpt's per-channel [out] scale), no zero point. It
// returns the scale, its shape as the dequantisation reads it, and the
// block, as transform's dequant derives them.
func (p *plan) plainFP8(e *transform.Expr) (sc *source, shape []int64, bm, bn int64, ok bool) {
	if e.Op != transform.OpDequant && e.Op != transform.OpFP8 || len(e.Args) != 2 || !e.Args[0].IsLeaf() {
		return nil, nil, 0, 0, false
	}
	w := p.inv.tensors[e.Args[0].Key]
	s := e.Args[1]
	if s.Op == transform.OpReshape && len(s.Args) == 1 {
		s = s.Args[0]
	}
	if w == nil || !isFP8(w.DType) || !s.IsLeaf() {
		return nil, nil, 0, 0, false
	}
	sc = p.inv.tensors[s.Key]
	if sc == nil || !isFloat(sc.DType) {
		return nil, nil, 0, 0, false
	}
	shape = e.Args[1].Type.Shape
	if sc.Elements() == 1 && (len(e.Ints) == 0 || len(shape) < 2) {
		return sc, shape, 0, 0, true // one scale
	}
	r := len(w.Shape)
	if r < 2 || len(shape) != r {
		return nil, nil, 0, 0, false
	}
	if len(e.Ints) == 2 {
		return sc, shape, e.Ints[0], e.Ints[1], true
	}
	return sc, shape, w.Shape[r-2] / shape[r-2], w.Shape[r-1] / shape[r-1], true
}

// partRole names what a stored part is to its dequantisation.
func partRole(e *transform.Expr, key string) string {
	if e.Op == transform.OpDequant || e.Op == transform.OpFP8 {
		for i, a := range e.Args {
			if slices.Contains(a.Keys(), key) {
				return []string{"stored values", "scale", "zero point"}[min(i, 2)]
			}
		}
	}
	return "stored part"
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

// quantizable: a Linear weight of a decoder layer that is not MTP, a
// router, a norm or an embedding. Everything else stays in its float type.
func (p *plan) quantizable(k string, shape []int64) bool {
	if p.mtp.IsMTP(k) || len(shape) != 2 || !strings.HasSuffix(k, ".weight") {
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

// planQuant quantises k (shape [out, in]) from what g reads: a float
// tensor, or a quantised weight dequantised first (from says how).
func (p *plan) planQuant(k string, g *group, shape []int64, from string) {
	rows, cols := shape[0], shape[1]
	g.quantize = p.opts.Quantize
	a := p.accounts[g.src.Key]
	switch p.opts.Quantize {
	case QuantFP8Block:
		g.Kind = kindQuantBlk
		g.Outputs = []checkpoint.Entry{
			{Name: k, DType: "F8_E4M3", Shape: shape},
			{Name: k + "_scale_inv", DType: "F32", Shape: []int64{ceilDiv(rows, blockSize), ceilDiv(cols, blockSize)}},
		}
		a.Reason = fmt.Sprintf("%s to E4M3 with a float32 weight_scale_inv per %d×%d block", from, blockSize, blockSize)
	default:
		g.Kind = kindQuantChan
		g.outDT = p.targetDT(g.src.DType)
		g.Outputs = []checkpoint.Entry{
			{Name: k, DType: "F8_E4M3", Shape: shape},
			{Name: moduleOf(k) + ".weight_scale", DType: g.outDT, Shape: []int64{rows, 1}},
		}
		a.Reason = fmt.Sprintf("%s to E4M3 with a per-output-channel %s weight_scale", from, g.outDT)
	}
	p.add(g, k)
	a.Action = "quantized"
	for _, e := range g.Outputs {
		a.Outputs = append(a.Outputs, e.Name)
	}
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
