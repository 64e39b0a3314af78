package quant

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
)

// compressed-tensors (llm-compressor) formats strata reads.
const (
	ctFloat = "float-quantized" // F8_E4M3 weight + weight_scale
	ctPack  = "pack-quantized"  // int32 weight_packed + weight_scale (+ packed weight_zero_point) + weight_shape
	ctInt   = "int-quantized"   // int8 weight + weight_scale (+ weight_zero_point)
	ctNaive = "naive-quantized" // as int-quantized
	ctDense = "dense"           // weights stored as floats
)

type ctArgs struct {
	NumBits        int64   `json:"num_bits"`
	Type           string  `json:"type"`
	Symmetric      *bool   `json:"symmetric"`
	Strategy       string  `json:"strategy"`
	GroupSize      int64   `json:"group_size"`
	BlockStructure []int64 `json:"block_structure"`
	Dynamic        any     `json:"dynamic"`
	ActOrder       any     `json:"actorder"`
}

type ctGroup struct {
	name    string
	targets targets         // compiled Targets
	Targets []string        `json:"targets"`
	Weights *ctArgs         `json:"weights"`
	Input   json.RawMessage `json:"input_activations"`
	Output  json.RawMessage `json:"output_activations"`
	Format  string          `json:"format"`

	activation string // how the inputs of its modules are quantised
}

// symmetric: no zero points (compressed-tensors' default).
func (a *ctArgs) symmetric() bool { return a.Symmetric == nil || *a.Symmetric }

// fp8PerToken: dynamic symmetric FP8 with a scale per token, the one
// activation scheme strata computes.
func (a *ctArgs) fp8PerToken() bool {
	d, _ := a.Dynamic.(bool)
	return a.Type == "float" && a.NumBits == 8 && a.Strategy == "token" && d && (a.Symmetric == nil || *a.Symmetric)
}

// compressedTensors reads quant_method "compressed-tensors": config groups
// of weight quantisation (float 8-bit, int 4/8-bit; tensor, channel, group
// or block), matched to modules by their targets, with ignore.
func (r *resolver) compressedTensors(cfg config) error {
	for _, field := range []string{"kv_cache_scheme", "sparsity_config", "transform_config"} {
		if !isNull(cfg[field]) {
			return fmt.Errorf("quantization_config.%s is set (%s): strata does not implement it, and it changes the math", field, compact(cfg[field]))
		}
	}
	if s := cfg.str("quantization_status"); s != "" && s != "compressed" && s != "frozen" {
		return fmt.Errorf("quantization_config.quantization_status %q is not supported: strata reads compressed checkpoints", s)
	}
	var groups map[string]*ctGroup
	if err := json.Unmarshal(cfg["config_groups"], &groups); err != nil || len(groups) == 0 {
		return fmt.Errorf("quantization_config.config_groups: %s", orMissing(err))
	}
	ignore, err := rawStrings(cfg["ignore"])
	if err != nil {
		return fmt.Errorf("quantization_config.ignore: %w", err)
	}
	r.view.Excluded = ignore
	top := cfg.str("format")
	var sorted []*ctGroup
	for name, g := range groups {
		if g == nil {
			return fmt.Errorf("quantization_config.config_groups.%s is null: a config group describes its targets and weights", name)
		}
		g.name = name
		if g.Format == "" {
			g.Format = top
		}
		if err := g.check(r); err != nil {
			return err
		}
		if g.targets, err = compileTargets(g.Targets); err != nil {
			return fmt.Errorf("quantization_config.config_groups.%s.targets: %w", name, err)
		}
		sorted = append(sorted, g)
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	var formats []string
	for _, g := range sorted {
		formats = append(formats, g.describe())
	}
	r.view.Format = strings.Join(formats, "; ")
	ig, err := compileTargets(ignore)
	if err != nil {
		return fmt.Errorf("quantization_config.ignore: %w", err)
	}
	for _, m := range r.quantizedModules() {
		g, err := matchGroup(sorted, m)
		if err != nil {
			return err
		}
		if g == nil || ig.matchByName(m) {
			return fmt.Errorf("module %s holds quantised tensors but no config group of quantization_config targets it (or it is in ignore)", m)
		}
		if err := r.ctModule(m, g); err != nil {
			return err
		}
	}
	if r.weightsOnly { // static activation scales of schemes noted above
		for _, k := range r.ckpt.Keys() {
			for _, suffix := range []string{".input_scale", ".input_zero_point", ".input_global_scale", ".output_scale", ".output_zero_point"} {
				if m, ok := strings.CutSuffix(k, suffix); ok && r.view.Has(m+".weight") {
					r.hide(k, "activation scale: not carried into the float weights")
				}
			}
		}
	}
	if r.expertActivations > 0 {
		r.view.Notes = append(r.view.Notes, fmt.Sprintf("the inputs of %d routed-expert weights are not quantised, as transformers computes them (its MoE experts are fused parameters, not the Linear modules compressed-tensors quantises the inputs of); vLLM's fused-MoE kernels would quantise them per token", r.expertActivations))
	}
	return nil
}

func orMissing(err error) string {
	if err != nil {
		return err.Error()
	}
	return "missing or empty"
}

func compact(raw json.RawMessage) string {
	s := strings.Join(strings.Fields(string(raw)), " ")
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

// check refuses what a group asks that strata does not compute.
func (g *ctGroup) check(r *resolver) error {
	at := "quantization_config.config_groups." + g.name
	if !isNull(g.Input) {
		var in ctArgs
		if err := json.Unmarshal(g.Input, &in); err != nil {
			return fmt.Errorf("%s.input_activations: %w", at, err)
		}
		if in.fp8PerToken() {
			g.activation = ActivationFP8PerToken
		} else if err := r.unsupportedActivations(fmt.Errorf("%s.input_activations (%s) is not supported: strata computes FP8 dynamic per-token activations (FP8_DYNAMIC) only; export a weight-only checkpoint, or dequantise this one (strata convert --quantize none)", at, compact(g.Input))); err != nil {
			return err
		}
	}
	if !isNull(g.Output) {
		if err := r.unsupportedActivations(fmt.Errorf("%s.output_activations quantises outputs (%s): strata does not implement it", at, compact(g.Output))); err != nil {
			return err
		}
	}
	switch g.Format {
	case ctFloat, ctPack, ctInt, ctNaive, ctDense:
	default:
		return fmt.Errorf("%s.format %q is not supported: strata reads %s, %s, %s and %s", at, g.Format, ctFloat, ctPack, ctInt, ctDense)
	}
	w := g.Weights
	if w == nil {
		return fmt.Errorf("%s has no weights quantisation", at)
	}
	switch {
	case w.Type == "float" && w.NumBits == 8, w.Type == "int" && (w.NumBits == 4 || w.NumBits == 8 || w.NumBits == 2):
	default:
		return fmt.Errorf("%s.weights: %s %d-bit weights are not supported: strata reads float 8-bit and int 2-, 4- and 8-bit", at, w.Type, w.NumBits)
	}
	switch w.Strategy {
	case "tensor", "channel":
	case "group":
		if w.GroupSize <= 0 {
			return fmt.Errorf("%s.weights.group_size %d: group strategy needs a positive group size", at, w.GroupSize)
		}
	case "block":
		if len(w.BlockStructure) != 2 || w.BlockStructure[0] <= 0 || w.BlockStructure[1] <= 0 {
			return fmt.Errorf("%s.weights.block_structure %v: block strategy needs two positive sizes", at, w.BlockStructure)
		}
	default:
		return fmt.Errorf("%s.weights.strategy %q is not supported: strata reads tensor, channel, group and block", at, w.Strategy)
	}
	if d, _ := w.Dynamic.(bool); d || w.Dynamic == "local" {
		return fmt.Errorf("%s.weights.dynamic is %v: dynamic weight scales are not stored, so strata cannot read them", at, w.Dynamic)
	}
	if a, ok := w.ActOrder.(string); ok && a == "group" {
		return fmt.Errorf("%s.weights.actorder \"group\" (activation-ordered groups, weight_g_idx) is not supported", at)
	}
	return nil
}

func (g *ctGroup) describe() string {
	w := g.Weights
	s := fmt.Sprintf("%s: %s %d-bit weights", g.Format, w.Type, w.NumBits)
	switch w.Strategy {
	case "group":
		s += fmt.Sprintf(", groups of %d", w.GroupSize)
	case "block":
		s += fmt.Sprintf(", %d×%d blocks", w.BlockStructure[0], w.BlockStructure[1])
	default:
		s += ", per " + w.Strategy
	}
	if w.Symmetric != nil && !*w.Symmetric {
		s += ", asymmetric"
	}
	if g.activation == ActivationFP8PerToken {
		s += "; activations FP8 per token, dynamic"
	}
	return s
}

// targets are compressed-tensors' module targets: "re:" patterns (matched
// from the start of the name, as Python's re.match), exact module names,
// and class names ("Linear"), which match any module holding quantised
// tensors.
type targets struct {
	names   []string
	res     []*regexp.Regexp
	classes bool
}

func compileTargets(list []string) (targets, error) {
	var t targets
	for _, s := range list {
		switch {
		case strings.HasPrefix(s, "re:"):
			re, err := regexp.Compile("^(?:" + s[3:] + ")")
			if err != nil {
				return t, fmt.Errorf("target %q is a pattern strata cannot read: %w", s, err)
			}
			t.res = append(t.res, re)
		case isClassName(s):
			t.classes = true
		default:
			t.names = append(t.names, s)
		}
	}
	return t, nil
}

func isClassName(s string) bool {
	return s != "" && unicode.IsUpper(rune(s[0])) && !strings.Contains(s, ".")
}

// matchByName reports a name or pattern match (not a class match).
func (t targets) matchByName(m string) bool {
	if slices.Contains(t.names, m) {
		return true
	}
	for _, re := range t.res {
		if re.MatchString(m) {
			return true
		}
	}
	return false
}

// matchGroup is the group whose targets name m, else the one whose class
// target applies; two equally good matches are ambiguous.
func matchGroup(groups []*ctGroup, m string) (*ctGroup, error) {
	var byName, byClass []*ctGroup
	for _, g := range groups {
		if g.targets.matchByName(m) {
			byName = append(byName, g)
		} else if g.targets.classes {
			byClass = append(byClass, g)
		}
	}
	for _, found := range [][]*ctGroup{byName, byClass} {
		switch len(found) {
		case 0:
			continue
		case 1:
			return found[0], nil
		default:
			return nil, fmt.Errorf("module %s is targeted by config groups %s and %s: strata cannot tell which quantisation it has", m, found[0].name, found[1].name)
		}
	}
	return nil, nil
}

// quantizedModules lists the modules whose weight is stored quantised:
// packed, FP8 or int8 beside a weight_scale.
func (r *resolver) quantizedModules() []string {
	seen := make(map[string]bool, scales(r.ckpt))
	for _, t := range r.ckpt.Sorted() {
		k := t.Key
		switch {
		case strings.HasSuffix(k, ".weight_scale"):
			// A packed or other non-float weight is found by its own key
			// below; an I64 one only beside a scale.
			m := strings.TrimSuffix(k, ".weight_scale")
			if w, ok := r.tensor(m + ".weight"); ok && w.DType == "I64" {
				seen[m] = true
			}
		case strings.HasSuffix(k, ".weight_packed"), strings.HasSuffix(k, ".weight") && !isFloatDType(t.DType) && t.DType != "I64":
			seen[moduleOf(k)] = true // found even without its scale: ctModule says what is missing
		}
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

func isFloatDType(dt string) bool { return dt == "F32" || dt == "BF16" || dt == "F16" || dt == "F64" }

// ctModule resolves one module's weight under its group: its tensors are
// checked here; the group builds its expression (expr) when asked.
func (r *resolver) ctModule(m string, g *ctGroup) error {
	w := g.Weights
	scale := m + ".weight_scale"
	st, ok := r.tensor(scale)
	if !ok {
		return fmt.Errorf("module %s is quantised (%s) but %s, its scale, is missing from the checkpoint", m, g.Format, scale)
	}
	key := m + ".weight"
	switch g.Format {
	case ctPack:
		packed := m + ".weight_packed"
		pt, ok := r.tensor(packed)
		if !ok {
			return fmt.Errorf("module %s: %s format but %s is missing from the checkpoint", m, ctPack, packed)
		}
		if w.Type != "int" {
			return fmt.Errorf("module %s: %s holds int weights, but its config group says %s", m, ctPack, w.Type)
		}
		if len(pt.Shape) < 2 {
			return fmt.Errorf("tensor %s has shape %v: packed weights are [out, words]", packed, pt.Shape)
		}
	case ctFloat, ctInt, ctNaive:
		if !r.has(key) {
			return fmt.Errorf("module %s: %s format but %s is missing from the checkpoint", m, g.Format, key)
		}
	default:
		return fmt.Errorf("module %s holds quantised tensors, but its config group's format is %s", m, g.Format)
	}
	zp := m + ".weight_zero_point"
	hasZero := r.has(zp)
	if hasZero && (w.Symmetric == nil || *w.Symmetric) {
		return fmt.Errorf("tensor %s is a zero point, but config group %s is symmetric", zp, g.name)
	}
	if !hasZero && w.Symmetric != nil && !*w.Symmetric {
		return fmt.Errorf("module %s is quantised asymmetrically (config group %s) but %s, its zero point, is missing", m, g.name, zp)
	}
	if w.Strategy == "tensor" && st.Elements() != 1 {
		return fmt.Errorf("quantised weight %s: scale %v of per-tensor quantisation must be one value", key, st.Shape)
	}
	activation := g.activation
	if g.activation != "" && isRoutedExpert(m) {
		// transformers 5 holds routed experts fused, as parameters rather
		// than Linear modules, and compressed-tensors quantises the inputs of
		// Linear modules only: the experts' inputs stay in float there.
		activation = ""
		r.expertActivations++
	}
	return r.add(key, g, activation)
}

// extraParts: a packed weight's weight_shape is part of it, though its
// shape is derived from the packing and the scale.
func (g *ctGroup) extraParts(c *checkpoint.Checkpoint, key string) []string {
	if g.Format != ctPack {
		return nil
	}
	if shape := strings.TrimSuffix(key, ".weight") + ".weight_shape"; hasTensor(c, shape) {
		return []string{shape}
	}
	return nil
}

// expr is a module's dequantisation under the group: (q − z) · s, q the
// stored values (unpacked when packed), z the zero point if stored, s the
// scale per tensor, channel, group or block.
//
// compressed-tensors dequantises in the scale's dtype (x_q.to(scale.dtype));
// transformers loading in float32 has upcast the scale first, so the
// product is float32's, as here (measured: rounding it to the stored
// bfloat16 scale's type moved logits by 5e-2).
func (g *ctGroup) expr(c *checkpoint.Checkpoint, key string) *transform.Expr {
	w := g.Weights
	m := strings.TrimSuffix(key, ".weight")
	scale := m + ".weight_scale"
	// Tensors are looked up only where the expression depends on them: a
	// symmetric FP8 weight's needs none (44,000 in GLM-4.6-FP8, built at
	// every export).
	var scaleShape []int64
	if g.Format == ctPack || !w.symmetric() {
		st, _ := c.Tensor(scale)
		scaleShape = st.Shape
	}
	values := transform.Leaf(key)
	var cols int64
	if g.Format == ctPack {
		packed := m + ".weight_packed"
		pt, _ := c.Tensor(packed)
		cols = unpackedColumns(pt.Shape[len(pt.Shape)-1], w, scaleShape)
		values = &transform.Expr{Op: transform.OpUnpackInt, Args: []*transform.Expr{transform.Leaf(packed)},
			Ints: []int64{w.NumBits, 1 << (w.NumBits - 1)}, Axis: -1, End: cols}
	} else if w.Strategy == "channel" { // a block is one output row
		if t, _ := c.Tensor(key); len(t.Shape) > 0 {
			cols = t.Shape[len(t.Shape)-1]
		}
	}
	args := []*transform.Expr{values, transform.Leaf(scale)}
	// ctModule checked that a weight has a zero point exactly when its
	// group is asymmetric.
	if !w.symmetric() {
		args = append(args, zeroPoint(c, m+".weight_zero_point", w, scaleShape, g.Format == ctPack))
	}
	var block []int64
	switch w.Strategy {
	case "channel": // a block is one output row
		block = []int64{1, cols}
	case "group":
		block = []int64{1, w.GroupSize}
	case "block":
		block = w.BlockStructure
	}
	return dequant(block, args...)
}

func hasTensor(c *checkpoint.Checkpoint, key string) bool { _, ok := c.Tensor(key); return ok }

func (r *resolver) has(key string) bool { return hasTensor(r.ckpt, key) }

// isRoutedExpert matches a routed expert's module, ...experts.<e>.<proj>
// (shared experts are shared_experts.<proj>, Linear modules in
// transformers). By hand: a regular expression per module was 30 ms of
// GLM-4.6-FP8's 44,000.
func isRoutedExpert(module string) bool {
	dot := strings.LastIndexByte(module, '.')
	if dot < 0 || dot == len(module)-1 {
		return false
	}
	rest := module[:dot] // ...experts.<e>
	dot = strings.LastIndexByte(rest, '.')
	if dot < 0 {
		return false
	}
	number, parent := rest[dot+1:], rest[:dot+1]
	if number == "" || strings.Trim(number, "0123456789") != "" {
		return false
	}
	return parent == "experts." || strings.HasSuffix(parent, ".experts.")
}

// unpackedColumns is a packed weight's input width: the scale's groups for
// group strategy (exact, as compressed-tensors derives it), else every value
// the words hold (real widths are multiples of the values per word).
func unpackedColumns(words int64, w *ctArgs, scaleShape []int64) int64 {
	full := words * (32 / w.NumBits)
	if w.Strategy == "group" && len(scaleShape) > 0 {
		if cols := scaleShape[len(scaleShape)-1] * w.GroupSize; cols < full {
			return cols
		}
	}
	return full
}

// zeroPoint is a weight_zero_point as the dequant reads it: in
// pack-quantized, group and channel zero points are int codes packed into
// int32 words along the output axis (pack_to_int32's packed_dim 0).
func zeroPoint(c *checkpoint.Checkpoint, key string, w *ctArgs, scaleShape []int64, packed bool) *transform.Expr {
	t, _ := c.Tensor(key)
	if !packed || t.DType != "I32" || len(scaleShape) < 2 || w.Strategy != "group" && w.Strategy != "channel" {
		return transform.Leaf(key)
	}
	axis := int64(len(t.Shape) - 2)
	return &transform.Expr{Op: transform.OpUnpackInt, Args: []*transform.Expr{transform.Leaf(key)},
		Ints: []int64{w.NumBits, 1 << (w.NumBits - 1)}, Axis: axis, End: scaleShape[axis]}
}
