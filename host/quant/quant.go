// Package quant reads how a checkpoint is quantised — config.json's
// quantization_config, ModelOpt's hf_quant_config.json — and presents each
// quantised weight as one thing: its logical key and shape, and the
// expression that dequantises it from the stored tensors (the weight, its
// scales, zero points, packing). Plugins see only the logical weights; the
// host lowers the expression in the graph or computes it (materialise).
//
// Whatever strata does not implement — a method, a format, a strategy, a
// dtype, activation or KV-cache quantisation that changes the math — is
// refused naming it, and so is a quantised tensor without its scale.
package quant

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights/transform"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// ModelOptFile is where NVIDIA ModelOpt records its quantisation.
const ModelOptFile = "hf_quant_config.json"

// Weight is one quantised weight as plugins see it.
type Weight struct {
	Key   string  // logical key: the name an unquantised checkpoint gives it
	Shape []int64 // logical shape
	// Values is the stored tensor of its values (the FP8 or packed weight).
	Values string
	// Activation is how the inputs of the linear layer this weight belongs
	// to are quantised ("" : they are not; ActivationFP8PerToken).
	Activation string
	// how builds the expression that dequantises the stored tensors to
	// float32, from the checkpoint, when asked: one per format or config
	// group, shared by its weights. A 90,000-weight release would otherwise
	// hold 90,000 expression trees (or closures).
	how  dequantizer
	ckpt *checkpoint.Checkpoint
}

// dequantizer builds a quantised weight's expression over the stored
// tensors of a checkpoint (which were checked when the weight was found).
type dequantizer interface {
	expr(c *checkpoint.Checkpoint, key string) *transform.Expr
}

// Dequant is a fresh expression dequantising w from its stored tensors to
// float32 (to be typed by Infer).
func (w *Weight) Dequant() *transform.Expr { return w.how.expr(w.ckpt, w.Key) }

// Typed is w's dequantisation typed over the checkpoint's tensors.
func (v *View) Typed(w *Weight) (*transform.Expr, error) {
	e := w.Dequant()
	if err := e.Infer(v.lookup); err != nil {
		return nil, fmt.Errorf("quantised weight %s: %w", w.Key, err)
	}
	return e, nil
}

// Elements is the number of values of the logical weight.
func (w *Weight) Elements() int64 {
	n := int64(1)
	for _, d := range w.Shape {
		n *= d
	}
	return n
}

// Activation quantisation schemes strata computes.
const (
	// ActivationFP8PerToken: dynamic, symmetric FP8 E4M3, one scale per
	// token (compressed-tensors' FP8_DYNAMIC input activations).
	ActivationFP8PerToken = "fp8_dynamic_per_token"
)

// View is a checkpoint's quantisation: the scheme, and its quantised
// weights by logical key. The zero View is an unquantised checkpoint.
type View struct {
	Method   string   // quant_method as the config names it ("" when none)
	Format   string   // a human description: format, dtype, block or group
	Excluded []string // modules the config keeps unquantised
	// Notes are what the user should know: what strata does not apply
	// (activation quantisation transformers does not apply either, KV scales).
	Notes []string
	// PluginHandled: the plugin binds the stored tensors itself (gpt-oss
	// MXFP4 blocks and scales, which its SDK layer dequantises).
	PluginHandled bool

	// weights are the quantised weights by logical key, each the index of
	// its dequantizer and activation scheme: a Weight is made when asked.
	// Qwen3-235B-FP8's 44,000 Weights were 8 MB of the export's peak heap.
	weights      map[string]weightRef
	dequantizers []dequantizer
	activations  []string // activation schemes by index; 0 is none
	shapes       [][]int64
	ckpt         *checkpoint.Checkpoint
	lookup       transform.Lookup  // types the stored tensors
	hidden       map[string]string // stored key -> why it is not a weight (activation, KV scales)
}

// weightRef is a quantised weight's dequantizer and activation scheme, its
// logical shape (an index into View.shapes: every expert shares one) and
// whether its values are stored packed (<module>.weight_packed, else under
// its own key): a Weight without building its expression.
type weightRef struct {
	how, activation uint16
	shape           uint32
	packed          bool
}

// Has reports whether key is a quantised weight's logical key.
func (v *View) Has(key string) bool {
	if v == nil {
		return false
	}
	_, ok := v.weights[key]
	return ok
}

// Len is the number of quantised weights.
func (v *View) Len() int {
	if v == nil {
		return 0
	}
	return len(v.weights)
}

// Activation is how the inputs of the linear layer whose weight has
// logical key are quantised ("" : they are not, or key is no quantised
// weight).
func (v *View) Activation(key string) string {
	if v == nil {
		return ""
	}
	if ref, ok := v.weights[key]; ok {
		return v.activations[ref.activation]
	}
	return ""
}

// QuantizesActivations reports whether some quantised weight's layer input
// is quantised too (Activation is not "" for every key).
func (v *View) QuantizesActivations() bool { return v != nil && len(v.activations) > 1 }

// Quantized reports whether the checkpoint holds quantised weights strata
// dequantises.
func (v *View) Quantized() bool { return v != nil && len(v.weights) > 0 }

// Weight is the quantised weight with logical key, if there is one.
func (v *View) Weight(key string) (*Weight, bool) {
	if v == nil {
		return nil, false
	}
	ref, ok := v.weights[key]
	if !ok {
		return nil, false
	}
	values := key
	if ref.packed {
		values = strings.TrimSuffix(key, ".weight") + packedSuffix
	}
	return &Weight{Key: key, Shape: v.shapes[ref.shape], Values: values, Activation: v.activations[ref.activation],
		how: v.dequantizers[ref.how], ckpt: v.ckpt}, true
}

// Weights lists the quantised weights by logical key.
func (v *View) Weights() []*Weight {
	if v == nil {
		return nil
	}
	keys := make([]string, 0, len(v.weights))
	for k := range v.weights {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*Weight, len(keys))
	for i, k := range keys {
		out[i], _ = v.Weight(k)
	}
	return out
}

// extraParts: stored tensors of a weight its dequantisation does not read
// (a packed weight's weight_shape, derived from the packing and the scale).
type extraParts interface {
	extraParts(c *checkpoint.Checkpoint, logical string) []string
}

// Stored reports whether key is a stored part of a quantised weight (a
// packed tensor, a scale, a zero point) or a scale strata does not use: a
// tensor plugins never see. The logical key itself, when the stored weight
// has its name (an FP8 weight), is the weight, not a part.
func (v *View) Stored(key string) bool {
	if v == nil {
		return false
	}
	if _, logical := v.weights[key]; logical {
		return false
	}
	if _, hidden := v.hidden[key]; hidden {
		return true
	}
	_, _, part := v.partOf(key)
	return part
}

// Auxiliary reports whether key is a stored tensor that is no parameter:
// a scale, a zero point, a packing shape, an unused activation scale.
func (v *View) Auxiliary(key string) bool {
	if !v.Stored(key) {
		return false
	}
	_, values, part := v.partOf(key)
	return !part || !values
}

// partOf finds the quantised weight whose stored part key is by the names
// the formats give their parts (values: key is its values, a packed
// weight): a rule, not a map of 88,000 parts. Read checked that the rule
// names exactly the tensors each weight's dequantisation reads.
// (logical is the weight's module, or its key for fine-grained FP8.)
func (v *View) partOf(key string) (logical string, values, ok bool) {
	var buf [256]byte // the logical key, built without allocating
	for _, suffix := range partSuffixes {
		base, cut := strings.CutSuffix(key, suffix)
		if !cut {
			continue
		}
		name := append(buf[:0], base...)
		if suffix != fp8ScaleSuffix {
			name = append(name, ".weight"...)
		}
		if _, ok := v.weights[string(name)]; ok {
			return base, suffix == packedSuffix, true
		}
	}
	return "", false, false
}

// packedSuffix names a packed weight's values (compressed-tensors).
const packedSuffix = ".weight_packed"

// partSuffixes end the names of quantised weights' stored parts: fine-
// grained FP8's scale on any weight key, the others on the module.
var partSuffixes = []string{fp8ScaleSuffix, packedSuffix, ".weight_scale", ".weight_scale_2", ".weight_zero_point", ".weight_shape"}

// Expand replaces each leaf of e that names a quantised weight by its
// dequantisation (a fresh copy), leaving every other leaf as it is.
func (v *View) Expand(e *transform.Expr) *transform.Expr {
	if v == nil || len(v.weights) == 0 {
		return e
	}
	if e.IsLeaf() {
		if ref, ok := v.weights[e.Key]; ok {
			return v.dequantizers[ref.how].expr(v.ckpt, e.Key)
		}
		return e
	}
	out := *e
	out.Args = make([]*transform.Expr, len(e.Args))
	for i, a := range e.Args {
		out.Args[i] = v.Expand(a)
	}
	return &out
}

// Inventory is the plugin's view of the checkpoint: every tensor as stored,
// except that a quantised weight is one float32 tensor of its logical
// shape, and its stored parts (and unused scales) are not listed.
func (v *View) Inventory(ckpt *checkpoint.Checkpoint) []*pb.TensorInfo {
	tensors := ckpt.Sorted()
	out := make([]*pb.TensorInfo, 0, len(tensors))
	info := func(key, dt string, shape []int64, stored *checkpoint.Tensor) *pb.TensorInfo {
		sh, _ := ckpt.Shard(stored.Shard)
		return &pb.TensorInfo{Key: key, Dtype: dt, Shape: shape, Unindexed: sh.Unindexed}
	}
	// A weight stored under its own key (fine-grained FP8) takes its
	// place in the checkpoint's order; one whose values are stored under
	// another (a packed weight) is added after, and the list sorted: a
	// sort of Kimi-K2's 69,000 expert weights was 47 ms, 3% of its CPU.
	var weights map[string]weightRef
	if v != nil {
		weights = v.weights
	}
	var renamed []*Weight
	for _, t := range tensors {
		k := t.Key
		if ref, ok := weights[k]; ok {
			if !ref.packed {
				out = append(out, info(k, "F32", v.shapes[ref.shape], t))
			}
			continue
		}
		if v.Stored(k) {
			continue
		}
		out = append(out, info(k, t.DType, t.Shape, t))
	}
	for k, ref := range weights {
		if ref.packed {
			w, _ := v.Weight(k)
			renamed = append(renamed, w)
		}
	}
	if len(renamed) == 0 {
		return out
	}
	for _, w := range renamed {
		t, _ := ckpt.Tensor(w.Values)
		out = append(out, info(w.Key, "F32", w.Shape, t))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Read reads ckpt's quantisation and resolves every quantised weight
// against its tensors. An unquantised checkpoint gives an empty View.
func Read(ckpt *checkpoint.Checkpoint) (*View, error) { return read(ckpt, false) }

// ReadWeights is Read for a reader of the weights alone (strata convert
// writing a float checkpoint, which carries no activation quantisation):
// activation schemes strata cannot compute are noted, not refused, and
// their scales are not weights.
func ReadWeights(ckpt *checkpoint.Checkpoint) (*View, error) { return read(ckpt, true) }

func read(ckpt *checkpoint.Checkpoint, weightsOnly bool) (*View, error) {
	cfg, err := quantConfig(ckpt)
	if err != nil {
		return nil, err
	}
	r := &resolver{ckpt: ckpt, weightsOnly: weightsOnly, how: map[dequantizer]uint16{},
		view: &View{weights: map[string]weightRef{}, activations: []string{""}, ckpt: ckpt, hidden: map[string]string{}}, parts: map[string]bool{}, shapes: map[shapeID]uint32{}}
	r.view.lookup = storedTypes(ckpt) // not r.lookup: the view would keep the resolver's maps
	if cfg != nil {
		// Sized once (growing to GLM-4.6-FP8's 44,000 weights rehashed 11
		// times): every format stores a weight's scale as <...>_scale or
		// <...>_scale_inv.
		n := scales(ckpt)
		r.view.weights = make(map[string]weightRef, n)
		r.parts = make(map[string]bool, n)
		if err := r.scheme(cfg); err != nil {
			return nil, err
		}
	}
	if err := r.strays(); err != nil {
		return nil, err
	}
	return r.view, nil
}

// scales counts the stored tensors named as weight scales.
func scales(ckpt *checkpoint.Checkpoint) int {
	n := 0
	for _, t := range ckpt.Sorted() {
		if k := t.Key; strings.HasSuffix(k, ".weight_scale") || strings.HasSuffix(k, fp8ScaleSuffix) {
			n++
		}
	}
	return n
}

// config is a quantization_config, kept raw: each method reads its fields.
type config map[string]json.RawMessage

func (c config) str(key string) string {
	var s string
	_ = json.Unmarshal(c[key], &s)
	return s
}

// quantConfig is config.json's quantization_config (also under
// text_config, as multimodal releases nest it), else ModelOpt's
// hf_quant_config.json turned into one.
func quantConfig(ckpt *checkpoint.Checkpoint) (config, error) {
	var top struct {
		Quant      config `json:"quantization_config"`
		TextConfig struct {
			Quant config `json:"quantization_config"`
		} `json:"text_config"`
	}
	if err := json.Unmarshal(ckpt.ConfigJSON, &top); err != nil {
		return nil, fmt.Errorf("config.json: quantization_config: %w", err)
	}
	cfg := top.Quant
	if cfg == nil {
		cfg = top.TextConfig.Quant
	}
	if cfg != nil {
		if _, ok := cfg["quant_method"]; !ok {
			return nil, fmt.Errorf("config.json: quantization_config has no quant_method: strata cannot tell how the weights are quantised")
		}
		return cfg, nil
	}
	data, err := ckpt.ReadFile(ModelOptFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ModelOptFile, err)
	}
	return modelOptConfig(data)
}

// resolver builds a View over one checkpoint.
type resolver struct {
	ckpt *checkpoint.Checkpoint
	view *View
	// expertActivations counts routed-expert weights whose input
	// quantisation transformers does not apply.
	expertActivations int
	// weightsOnly: the reader reads weights, not the model's math (ReadWeights).
	weightsOnly bool
	how         map[dequantizer]uint16 // index of each in view.dequantizers
	// parts are the stored tensors each weight's dequantisation reads
	// (true: its values), beside their logical keys: what View.partOf's
	// naming rule must find (strays).
	parts   map[string]bool
	shapes  map[shapeID]uint32 // index of each in view.shapes
	scratch *transform.Expr    // see expression
}

// shapeID keys a shape: its dims, or past four its printed form.
type shapeID struct {
	rank int
	dims [4]int64
	long string
}

// unsupportedActivations refuses what strata cannot compute of activation
// quantisation, or, reading weights only, notes it.
func (r *resolver) unsupportedActivations(err error) error {
	if !r.weightsOnly {
		return err
	}
	r.view.Notes = append(r.view.Notes, "not carried into the float weights: "+err.Error())
	return nil
}

func (r *resolver) scheme(cfg config) error {
	method := cfg.str("quant_method")
	r.view.Method = method
	switch method {
	case "fp8":
		return r.fineGrainedFP8(cfg)
	case "compressed-tensors":
		return r.compressedTensors(cfg)
	case "modelopt":
		return r.modelOpt(cfg)
	case "mxfp4":
		r.view.Format = "MXFP4 (E2M1 blocks of 32, E8M0 scales): dequantised by the architecture's plugin"
		r.view.PluginHandled = true
		return nil
	}
	return fmt.Errorf("quantization_config.quant_method %q is not supported: strata reads fp8 (fine-grained FP8), compressed-tensors (float-quantized, pack-quantized, int-quantized), modelopt (FP8, NVFP4) and mxfp4; dequantise the checkpoint first (strata convert reads the same methods)", method)
}

// tensor is a stored tensor's dtype and shape, if present.
func (r *resolver) tensor(key string) (*checkpoint.Tensor, bool) { return r.ckpt.Tensor(key) }

// shape is the index of shape in view.shapes, added when new.
func (r *resolver) shape(shape []int64) uint32 {
	id := shapeID{rank: len(shape)}
	if copy(id.dims[:], shape) < len(shape) {
		id.long = fmt.Sprint(shape)
	}
	i, ok := r.shapes[id]
	if !ok {
		i = uint32(len(r.view.shapes))
		r.shapes[id] = i
		r.view.shapes = append(r.view.shapes, slices.Clone(shape))
	}
	return i
}

// add records a quantised weight: its logical key, with its dequantizer
// and activation scheme. The expression over its stored parts is built
// and checked against their types now, and built again when asked.
// near are stored parts the caller has at hand, typed without a lookup.
func (r *resolver) add(key string, how dequantizer, activation string, near ...*checkpoint.Tensor) error {
	e := r.expression(key, how, near)
	lookup := r.lookup
	if len(near) > 0 {
		lookup = func(k string) (transform.Type, error) {
			for _, t := range near {
				if t.Key == k {
					return transform.TypeOf(t), nil
				}
			}
			return r.lookup(k)
		}
	}
	// The view keeps the checkpoint's own string of the key.
	if len(near) > 0 && near[0].Key == key {
		key = near[0].Key
	} else {
		key = r.ckpt.Key(key)
	}
	if err := e.Infer(lookup); err != nil {
		return fmt.Errorf("quantised weight %s: %w", key, err)
	}
	i, ok := r.how[how]
	if !ok {
		i = uint16(len(r.view.dequantizers))
		r.how[how] = i
		r.view.dequantizers = append(r.view.dequantizers, how)
	}
	a := slices.Index(r.view.activations, activation)
	if a < 0 {
		a = len(r.view.activations)
		r.view.activations = append(r.view.activations, activation)
	}
	parts := e.Keys()
	packed := parts[0] != key
	if packed && parts[0] != strings.TrimSuffix(key, ".weight")+packedSuffix {
		return fmt.Errorf("quantised weight %s: its values are stored as %s, which strata does not name: please report this checkpoint's layout", key, parts[0])
	}
	r.view.weights[key] = weightRef{how: i, activation: uint16(a), shape: r.shape(e.Type.Shape), packed: packed}
	if x, ok := how.(extraParts); ok {
		parts = append(parts, x.extraParts(r.ckpt, key)...)
	}
	for j, k := range parts {
		if k != key {
			r.parts[k] = j == 0 // the first is the values
		}
	}
	return nil
}

// expression is how's expression of key, to check. A block-FP8 weight
// whose two parts are at hand (near) is checked in one scratch expression
// that serves every such weight: nothing add keeps points into it (Kimi-K2's
// read built and dropped 69,000, 35 MB).
func (r *resolver) expression(key string, how dequantizer, near []*checkpoint.Tensor) *transform.Expr {
	b, ok := how.(*blockFP8)
	if !ok || len(near) != 2 {
		return how.expr(r.ckpt, key)
	}
	if r.scratch == nil {
		r.scratch = dequant(nil, transform.Leaf(""), transform.Leaf(""))
	}
	e := r.scratch
	e.Ints, e.Type = b.block, transform.Type{}
	e.Args[0].Key, e.Args[1].Key = near[0].Key, near[1].Key
	return e
}

// dequant is the dequant expression of args with block ints (nil: none).
func dequant(ints []int64, args ...*transform.Expr) *transform.Expr {
	return &transform.Expr{Op: transform.OpDequant, Args: args, Ints: slices.Clone(ints)}
}

// infer types e over the stored tensors, naming the weight on error.
func (r *resolver) infer(e *transform.Expr) error {
	if err := e.Infer(r.lookup); err != nil {
		return fmt.Errorf("quantised weight %s: %w", e, err)
	}
	return nil
}

func (r *resolver) lookup(key string) (transform.Type, error) { return storedType(r.ckpt, key) }

// storedTypes types the tensors ckpt stores.
func storedTypes(ckpt *checkpoint.Checkpoint) transform.Lookup {
	return func(key string) (transform.Type, error) { return storedType(ckpt, key) }
}

func storedType(ckpt *checkpoint.Checkpoint, key string) (transform.Type, error) {
	t, ok := ckpt.Tensor(key)
	if !ok {
		return transform.Type{}, fmt.Errorf("tensor %s is missing from the checkpoint", key)
	}
	return transform.TypeOf(t), nil
}

// hide records a stored tensor that is no weight: a scale strata does not
// apply, with why.
func (r *resolver) hide(key, why string) { r.view.hidden[key] = why }

// strays refuses what would otherwise be read wrong: an FP8, FP4 or packed
// tensor, or a scale, that no quantised weight accounts for.
func (r *resolver) strays() error {
	if r.view.PluginHandled {
		return nil
	}
	var bad []string
	for _, t := range r.ckpt.Sorted() {
		k := t.Key
		values, part := r.parts[k]
		logical, ruleValues, rulePart := r.view.partOf(k)
		if part && (!rulePart || ruleValues != values) {
			return fmt.Errorf("tensor %s is part of a quantised weight but not named as strata finds parts (%s): please report this checkpoint's layout", k, logical)
		}
		if _, quantized := r.view.weights[k]; quantized || part || r.view.hidden[k] != "" {
			continue
		}
		if looksQuantized(k, t.DType) {
			bad = append(bad, fmt.Sprintf("%s (%s %v)", k, t.DType, t.Shape))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	n := len(bad)
	if n > 3 {
		bad = append(bad[:3], fmt.Sprintf("and %d more", n-3))
	}
	if r.view.Method == "" {
		return fmt.Errorf("the checkpoint holds quantised tensors but config.json has no quantization_config (nor is there an %s): %s; strata cannot tell how to dequantise them", ModelOptFile, strings.Join(bad, ", "))
	}
	return fmt.Errorf("quantization_config (%s) does not account for these quantised tensors: %s; each needs its weight and scales as the format stores them", r.view.Method, strings.Join(bad, ", "))
}

// looksQuantized: a dtype no plain weight has, or a name only quantised
// checkpoints use.
func looksQuantized(key, dt string) bool {
	switch dt {
	case "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4":
		return true
	}
	for _, suffix := range []string{"_scale_inv", ".weight_scale", ".weight_scale_2", ".weight_packed", ".weight_zero_point", ".weight_global_scale", ".weight_g_idx", ".weight_shape", ".input_scale", ".input_global_scale"} {
		if strings.HasSuffix(key, suffix) {
			return true
		}
	}
	return false
}

// moduleOf is a tensor key's module: the key less its last name.
func moduleOf(key string) string {
	if i := strings.LastIndexByte(key, '.'); i >= 0 {
		return key[:i]
	}
	return ""
}

func rawStrings(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var out []string
	err := json.Unmarshal(raw, &out)
	return out, err
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null" || s == "{}" || s == "[]"
}
