package decoder

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/hf"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// Model is one checkpoint as an architecture's Load sees it: the config
// (its own fields read through the embedded Reader, the common ones already
// in Common), the tensor inventory, the export's options. Load declares
// the layer kinds and, where the architecture differs, sets the fields
// below.
type Model struct {
	*hf.Reader
	Common
	// Top is the whole config.json (the Reader may read a nested object).
	Top       hf.Config
	Inventory sdk.Inventory
	Export    *pb.ExportOptions // nil in Check
	Options   map[string]string // plugin options, defaults filled in
	// Prefix is where the language model's keys live: Architecture.Prefix,
	// or the one of Architecture.Prefixes the checkpoint uses.
	Prefix string
	// HeadKey is the untied head's key ("lm_head.weight" when empty).
	HeadKey string
	// KindOf names layer i's kind; nil: every layer is the first kind.
	KindOf func(i int) string
	// MTP is what the architecture found of multi-token-prediction layers.
	MTP *pb.MTPLayout
	// InputsEmbeds: the model takes inputs_embeds instead of input_ids (no
	// embed part; the caller embeds, e.g. merging vision embeddings).
	InputsEmbeds bool
	// OutputHidden: the model also returns hidden_states [batch, seq, hidden],
	// the final norm's output at every position (what an MTP draft reads).
	OutputHidden bool
	// PositionIDsRank 3 makes position_ids [3, batch, seq] (multimodal RoPE's
	// rows, tables from RoPE.Tables3; see positions3.go); 0 or 2: [batch, seq].
	PositionIDsRank int
	// PositionRows 4 (with PositionIDsRank 3) makes position_ids [4, batch,
	// seq]: row 0 the sequence position, rows 1..3 MRoPE's t/h/w (tables
	// from RoPE.Tables4); 0 or 3: the three MRoPE rows alone.
	PositionRows int
	// ExtraInputs are graph inputs after position_ids that parts declare
	// as formal inputs of the same name (vision_embeds); input_ids may be
	// one, for the context part of windows after the first.
	ExtraInputs []*pb.IOSpec
	// Embed, when set, finishes the embed part: it gets the looked-up
	// embeddings [B,S,H] and input_ids and returns the hidden state (image
	// tokens replaced by vision rows). It may declare formal inputs.
	Embed func(f *fn.Func, inputIDs, embedded fn.Value) fn.Value
	// EmbedScale, when not 0, multiplies the looked-up embeddings, rounded
	// to the compute dtype as transformers rounds it to the weights' dtype
	// (Gemma: sqrt(hidden_size)), before Embed.
	EmbedScale float64
	// NormOnePlus makes every RMSNorm the layers' Norms, the attention's
	// q/k norms and the final norm apply Gemma's: weights stored as an
	// offset from 1, y·(1 + w) computed in float32 (blocks.RMSNormOnePlus).
	NormOnePlus bool
	// FinalSoftCap, when not 0, soft-caps the logits the final part
	// outputs: FinalSoftCap·tanh(logits/FinalSoftCap), in the compute dtype
	// before the cast to float32 (Gemma-2/3's final_logit_softcapping).
	FinalSoftCap float64
	// SlotsCache names the cache the context part reads ctx_len from (its
	// axis 2) and whose kinds read the context values: past_key when
	// empty; k_pe for MLA, whose layers cache no past_key.
	SlotsCache string

	arch          Architecture
	defaulted     []string // the Architecture.Defaults keys config.json lacked
	kinds         []*Kind
	context       []ContextValue
	ropes         map[string]blocks.RoPE
	models        []*pb.ModelSpec
	modelBuilders map[string]func(*fn.Func) (*pb.BuildResponse, error)
	notes         []string
	storedAt      map[int32]string // StoreLayer
	sideKinds     []*Kind          // SideKind
	// ortContextLength is max_position_embeddings, read for --target ort.
	ortContextLength int64
}

// Kind is a kind of decoder layer: one ONNX function, one body.
type Kind struct {
	Name     string // in the plan: "decoder", "moe", "sliding", ...
	Function string // the ONNX function: LlamaDecoderLayer
	// Caches overrides the kind's per-layer state (default: KVCaches).
	Caches func(m *Model) []*pb.CacheSpec
	Body   func(l *Layer) error
	// Post, when set, transforms the hidden state the body outputs (it may
	// declare inputs): a step after the layer that belongs to these layers
	// alone, like Qwen3-VL's DeepStack features added after the first
	// layers. A kind is one ONNX function, so such layers are kinds of
	// their own (Model.With).
	Post func(l *Layer, hidden fn.Value) fn.Value
}

// With is a kind declared like k, named name with function function, its
// output hidden state transformed by post (Kind.Post).
func (m *Model) With(k *Kind, name, function string, post func(l *Layer, hidden fn.Value) fn.Value) *Kind {
	c := m.Kind(name, function, k.Body)
	c.Caches, c.Post = k.Caches, post
	return c
}

func (k *Kind) caches(m *Model) []*pb.CacheSpec {
	if k.Caches != nil {
		return k.Caches(m)
	}
	return KVCaches(m.Export, m.KVHeads, m.HeadDim)
}

// Kind declares a layer kind. The first kind declared is every layer's
// unless KindOf says otherwise.
func (m *Model) Kind(name, function string, body func(l *Layer) error) *Kind {
	k := &Kind{Name: name, Function: function, Body: body}
	m.kinds = append(m.kinds, k)
	return k
}

// SideKind declares a kind no decoder layer has: the layer of a separate
// model (an MTP draft's) that KindFunction finds by name. It is not in the
// plan.
func (m *Model) SideKind(name, function string, body func(l *Layer) error) *Kind {
	k := &Kind{Name: name, Function: function, Body: body}
	m.sideKinds = append(m.sideKinds, k)
	return k
}

// HasKind reports whether a kind (decoder or side) of that name is declared.
func (m *Model) HasKind(name string) bool {
	_, ok := m.kind(name)
	return ok
}

// AddContext adds a value the context part computes once for all layers.
func (m *Model) AddContext(v ContextValue) { m.context = append(m.context, v) }

// AddRoPE adds a second pair of RoPE tables the context part computes
// (from the sequence positions) beside the model's, for the layers whose
// attention names it (Attention.RoPE): Gemma-3's sliding layers turn at
// rope_local_base_freq, its full ones at rope_theta.
func (m *Model) AddRoPE(name string, rope blocks.RoPE) {
	if m.ropes == nil {
		m.ropes = map[string]blocks.RoPE{}
	}
	if _, ok := m.ropes[name]; ok {
		m.Fail(fmt.Errorf("the plugin adds RoPE %q twice", name))
		return
	}
	m.ropes[name] = rope
	for _, v := range ropeTables(name, rope) {
		m.AddContext(v)
	}
}

// norm is the kind of the model's RMSNorms.
// slotsCache is SlotsCache, past_key by default.
func (m *Model) slotsCache() string {
	if m.SlotsCache == "" {
		return PastKey
	}
	return m.SlotsCache
}

func (m *Model) norm() blocks.Norm {
	return blocks.Norm{Eps: m.Eps, OnePlus: m.NormOnePlus, ORT: m.ORT()}
}

// AddModel declares a separate model the plugin builds (part "model"):
// build gets a function named <Name><Spec.Name> and returns it with its
// weight bindings (layer sdk.NonLayer).
func (m *Model) AddModel(spec *pb.ModelSpec, build func(f *fn.Func) (*pb.BuildResponse, error)) {
	m.models = append(m.models, spec)
	m.modelBuilders[spec.GetName()] = build
}

// Note records something the user should know that does not stop the
// export (Check's reasons of a supported model).
func (m *Model) Note(format string, args ...any) {
	m.notes = append(m.notes, fmt.Sprintf(format, args...))
}

// Defaulted reports whether config.json lacked key and the value is the
// architecture's default (Architecture.Defaults).
func (m *Model) Defaulted(key string) bool { return slices.Contains(m.defaulted, key) }

// explainDefaults adds to err the defaulted fields it names: a user reads
// "num_key_value_heads (4)" and learns config.json does not say 4.
func (m *Model) explainDefaults(err error) error {
	var keys, values []string
	for _, k := range m.defaulted {
		if strings.Contains(err.Error(), k) {
			keys = append(keys, k)
			values = append(values, k+" "+defaultValue(m.arch.Defaults[k]))
		}
	}
	switch len(keys) {
	case 0:
		return err
	case 1:
		return fmt.Errorf("%w (config.json omits %s: model_type %s's default is %s; set it in config.json to override)",
			err, keys[0], m.arch.ModelType, defaultValue(m.arch.Defaults[keys[0]]))
	}
	return fmt.Errorf("%w (config.json omits %s: model_type %s's defaults are %s; set them in config.json to override)",
		err, strings.Join(keys, ", "), m.arch.ModelType, strings.Join(values, ", "))
}

// defaultValue prints a default as config.json would hold it.
func defaultValue(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// Key is the checkpoint key of a language-model tensor: Prefix + name.
func (m *Model) Key(name string) string { return m.Prefix + name }

// LayerKey is the checkpoint key of decoder layer i's tensor name.
// (Concatenated, not Sprintf'd: GLM-4.6's Check builds 44,689 of them.)
func (m *Model) LayerKey(i int32, name string) string {
	if p, ok := m.storedAt[i]; ok {
		return p + name
	}
	return m.Prefix + "layers." + strconv.Itoa(int(i)) + "." + name
}

func (m *Model) kindOf(i int) *Kind {
	if m.KindOf == nil {
		return m.kinds[0]
	}
	k, _ := m.kind(m.KindOf(i))
	return k
}

func (m *Model) kind(name string) (*Kind, bool) {
	for _, ks := range [2][]*Kind{m.kinds, m.sideKinds} {
		for _, k := range ks {
			if k.Name == name {
				return k, true
			}
		}
	}
	return nil, false
}

func (m *Model) kindNames() string {
	var names []string
	for _, k := range m.kinds {
		names = append(names, k.Name)
	}
	return strings.Join(names, ", ")
}

// HeadWeight is the main model's head: the embedding when tied, else
// HeadKey (lm_head.weight when empty).
func (m *Model) HeadWeight() weight.Expr { return m.headWeight() }

// EmbedWeight is the main model's embedding table.
func (m *Model) EmbedWeight() weight.Expr {
	return weight.Tensor(m.Key("embed_tokens.weight"), int64(m.Vocab), int64(m.Hidden))
}

func (m *Model) headWeight() weight.Expr {
	if m.Tied {
		return weight.Tensor(m.Key("embed_tokens.weight"), int64(m.Vocab), int64(m.Hidden))
	}
	key := m.HeadKey
	if key == "" {
		key = "lm_head.weight"
	}
	return weight.Tensor(key, int64(m.Vocab), int64(m.Hidden))
}

func (m *Model) normWeight() weight.Expr { return weight.Tensor(m.Key("norm.weight"), int64(m.Hidden)) }

// layersOf lists the layers of kind k.
func (m *Model) layersOf(k *Kind) []int32 {
	var out []int32
	for i := range m.Layers {
		if m.kindOf(i) == k {
			out = append(out, int32(i))
		}
	}
	return out
}

// checkTensors checks the checkpoint holds every tensor the graph binds,
// with the shape the config implies. The work is bounded by the inventory,
// not by counts in config.json: the layer count was checked against the
// keys when loading, and the check stops after a few missing tensors.
func (m *Model) checkTensors() error {
	check := m.Inventory.Checker(maxReported)
	err := m.eachExpected(func(ts []sdk.ExpectedTensor) bool {
		check.Expect(ts...)
		return !check.Full()
	})
	if err != nil {
		return err
	}
	return check.Err()
}

// expected lists every tensor the graph binds.
func (m *Model) expected() ([]sdk.ExpectedTensor, error) {
	var out []sdk.ExpectedTensor
	err := m.eachExpected(func(ts []sdk.ExpectedTensor) bool {
		out = append(out, ts...)
		return true
	})
	return out, err
}

// eachExpected hands each binding's leaves to yield (the non-layer parts',
// then each kind's layers') until yield says stop.
func (m *Model) eachExpected(yield func([]sdk.ExpectedTensor) bool) error {
	for i := range m.Layers {
		if m.kindOf(i) == nil {
			return fmt.Errorf("layer %d: the plugin names kind %q, which it does not declare (kinds: %s)", i, m.KindOf(i), m.kindNames())
		}
	}
	embed := weight.Tensor(m.Key("embed_tokens.weight"), int64(m.Vocab), int64(m.Hidden))
	for _, w := range []weight.Expr{embed, m.normWeight(), m.headWeight()} {
		if !yield(w.Leaves()) {
			return nil
		}
	}
	for _, k := range m.kinds {
		l, err := m.declare(k)
		if err != nil {
			return err
		}
		for _, i := range m.layersOf(k) {
			for _, d := range l.declared {
				if !yield(d.bind(i).Leaves()) {
					return nil
				}
			}
		}
	}
	return nil
}

// maxReported is how many missing or misshapen tensors Check names.
const maxReported = 5

// checkLayerCount refuses a num_hidden_layers the inventory cannot back:
// the last layer must have tensors under its prefix.
func (m *Model) checkLayerCount() error {
	last := m.LayerKey(int32(m.Layers-1), "")
	if m.Inventory.HasPrefix(last) {
		return nil
	}
	held := m.Inventory.LayerIndices(m.Prefix + "layers.")
	if len(held) == 0 {
		return fmt.Errorf("config.json: num_hidden_layers is %d, but the checkpoint holds no tensor under %slayers.", m.Layers, m.Prefix)
	}
	return fmt.Errorf("config.json: num_hidden_layers is %d, but the checkpoint holds tensors for %d layers (%s..%d); the tensors of layer %d (%s*) are missing",
		m.Layers, len(held), fmt.Sprint(held[0]), held[len(held)-1], m.Layers-1, last)
}

// declare runs a kind's body once to learn its weights.
func (m *Model) declare(k *Kind) (*Layer, error) {
	l := newLayer(m, k, fn.NewFunc("strata.check", k.Function, fn.Float32))
	if err := k.Body(l); err != nil {
		return nil, fmt.Errorf("layer kind %s: %w", k.Name, err)
	}
	return l, m.Err
}

// buildLayers builds kind k's function and binds its weights for layers.
func (m *Model) buildLayers(domain string, dt fn.DType, k *Kind, layers []int32) (*pb.BuildResponse, error) {
	l := newLayer(m, k, fn.NewFunc(domain, k.Function, dt))
	if err := k.Body(l); err != nil {
		return nil, err
	}
	if m.Err != nil {
		return nil, m.Err
	}
	if !l.finished {
		return nil, fmt.Errorf("layer kind %s: the body returned without declaring its outputs (call l.Output)", k.Name)
	}
	var bindings []*pb.LayerWeights
	for _, i := range layers {
		if i < 0 || int(i) >= m.Layers || m.kindOf(int(i)) != k {
			return nil, fmt.Errorf("layer %d is not of kind %s", i, k.Name)
		}
		lw := &pb.LayerWeights{Layer: i}
		for _, d := range l.declared {
			lw.Bindings = append(lw.Bindings, weight.Bind(d.input, d.bind(i)))
		}
		bindings = append(bindings, lw)
	}
	return Response(l.Func, bindings...), nil
}

// HasLayerTensor reports whether layer i holds name (for layouts found
// from the keys present).
func (m *Model) HasLayerTensor(i int32, name string) bool {
	return m.Inventory.Has(m.LayerKey(i, name))
}

// LayerTensor is layer i's tensor name, if present.
func (m *Model) LayerTensor(i int32, name string) (*pb.TensorInfo, bool) {
	t, ok := m.Inventory[m.LayerKey(i, name)]
	return t, ok
}

// EveryLayer runs check on each layer of the given kind names (all layers
// when none), stopping at the first error.
func (m *Model) EveryLayer(check func(i int32) error, kinds ...string) error {
	for i := range m.Layers {
		if len(kinds) > 0 && m.KindOf != nil && !slices.Contains(kinds, m.KindOf(i)) {
			continue
		}
		if err := check(int32(i)); err != nil {
			return err
		}
	}
	return nil
}
