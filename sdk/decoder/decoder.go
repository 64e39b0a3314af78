// Package decoder is the declarative layer a decoder-only architecture is
// written on: the plugin states what differs from the common decoder —
// its own config fields, its layer kinds and their bodies — and this
// package answers Describe, Check, Plan and Build.
//
// A weight is declared once, where the layer body uses it
// (l.Weight("self_attn.q_norm.weight", hd)): that declaration is the layer
// function's formal input, the tensor Check expects of every layer of the
// kind, and the binding Build sends for each of them.
package decoder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/hf"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// Plugin is a plugin binary's architectures; it implements
// sdk.Architecture: `func main() { sdk.Serve(decoder.Plugin{...}) }`.
type Plugin struct {
	Name, Version string
	Architectures []Architecture
}

// Architecture is one model_type: data about it, and Load, which reads the
// architecture's own config fields and declares its layer kinds.
type Architecture struct {
	ModelType       string
	HFArchitectures []string
	// Name starts the names of the non-layer functions: <Name>Embed,
	// <Name>Context, <Name>Final.
	Name string
	// Capabilities as declared in Describe; nil means layerwise export is
	// supported and nothing else is claimed.
	Capabilities *pb.Capabilities
	// Targets are the export targets beyond the default it builds
	// (sdk.TargetORT: its layers map onto ONNX Runtime's form, ort.go),
	// declared in Describe's capabilities.
	Targets []string
	Options []*pb.PluginOption
	// ConfigObject, when set, is the nested config.json object holding the
	// language model's fields (e.g. text_config).
	ConfigObject string
	// Prefix is where the language model's keys live: "model." when empty;
	// "model.language_model." for Qwen3-VL.
	Prefix string
	// Defaults are the values the architecture's transformers configuration
	// class (configuration_<arch>.py) gives fields config.json omits, where
	// they differ from the common decoder's (Llama's: rms_norm_eps 1e-6,
	// num_key_value_heads the heads, head_dim hidden/heads, rope_theta
	// 1e4, untied embeddings): {"head_dim": 256, "rope_theta": 1e6}. They
	// are added to the config object (ConfigObject's when set) before
	// anything is read, so the common fields, the RoPE and Load see them;
	// a field config.json holds, null included, is kept.
	Defaults map[string]any
	// Prefixes, when set (instead of Prefix), are every prefix the language
	// model's keys may live under, for an architecture whose checkpoints
	// come in several layouts (Gemma-3's language_model.model. as the Hub
	// ships it, model.language_model. as transformers ≥ 4.52 holds it). The
	// SDK picks, before Load, the one whose <prefix>layers.* the checkpoint
	// holds and sets Model.Prefix to it; keys under none of them, or under
	// two, refuse the checkpoint with an error naming them.
	Prefixes []string
	// HeadKeys, when set, are the keys an untied head may have, in any of
	// the layouts (lm_head.weight, language_model.lm_head.weight): after
	// Load, unless it set Model.HeadKey, the SDK sets it to the one the
	// checkpoint holds; an untied model holding none of them, or two, is
	// refused naming them.
	HeadKeys []string
	Load     func(m *Model) error
}

// prefixes lists the prefixes the language model's keys may live under.
func (a Architecture) prefixes() []string {
	switch {
	case len(a.Prefixes) > 0:
		return a.Prefixes
	case a.Prefix != "":
		return []string{a.Prefix}
	}
	return []string{"model."}
}

var _ sdk.Architecture = Plugin{}

// Describe lists the architectures and what they support.
func (p Plugin) Describe(context.Context) (*pb.DescribeResponse, error) {
	d := &pb.DescribeResponse{Name: p.Name, Version: p.Version, ProtocolVersion: sdk.ProtocolVersion, SdkVersion: sdk.Version}
	for _, a := range p.Architectures {
		d.Architectures = append(d.Architectures, &pb.ArchitectureSupport{
			ModelType: a.ModelType, HfArchitectures: a.HFArchitectures, Capabilities: a.capabilities(), Options: a.Options})
	}
	return d, nil
}

func (a Architecture) capabilities() *pb.Capabilities {
	c := &pb.Capabilities{Layerwise: true}
	if a.Capabilities != nil {
		c = proto.Clone(a.Capabilities).(*pb.Capabilities)
	}
	c.Targets = append(c.Targets, a.Targets...)
	return c
}

// Check loads the model (config and every declared tensor); an error is
// the reason it is not supported.
func (p Plugin) Check(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	m, err := p.load(req.GetModel(), nil)
	if err == nil {
		err = m.checkTensors()
	}
	if err != nil {
		return &pb.CheckResponse{Reasons: []string{err.Error()}}, nil
	}
	return &pb.CheckResponse{Supported: true, LayerwiseSupported: m.arch.capabilities().GetLayerwise(),
		Reasons: m.notes}, nil
}

// Plan lists the layers, their kinds and caches, and the context values.
func (p Plugin) Plan(_ context.Context, req *pb.PlanRequest) (*pb.PlanResponse, error) {
	m, err := p.load(req.GetModel(), req.GetOptions())
	if err != nil {
		return nil, err
	}
	plan := &pb.PlanResponse{ModelType: m.arch.ModelType, VocabSize: int64(m.Vocab), HiddenSize: int64(m.Hidden),
		ContextOutputs: slices.Clone(StandardContext), Mtp: m.MTP, Models: m.models}
	if p := m.positions(); p.rank == 3 {
		plan.PositionIdsRank = 3
		plan.ContextOutputs = append(plan.ContextOutputs, CtxPositions)
		if p.rows == 4 {
			plan.PositionRows = 4
		}
	}
	plan.ExtraInputs = m.ExtraInputs
	for _, v := range m.context {
		plan.ContextOutputs = append(plan.ContextOutputs, v.Name)
	}
	plan.InputsEmbeds = m.InputsEmbeds
	if m.OutputHidden {
		plan.ExtraOutputs = append(plan.ExtraOutputs, &pb.IOSpec{Name: sdk.HiddenStates, Dtype: "compute", PartOutput: finalHidden,
			Shape: []*pb.Dim{DimParam("batch_size"), DimParam("seq_len"), DimSize(m.Hidden)}})
	}
	for _, k := range m.kinds {
		plan.Kinds = append(plan.Kinds, &pb.LayerKind{Name: k.Name, Caches: k.caches(m)})
	}
	for i := range m.Layers {
		plan.Layers = append(plan.Layers, &pb.Layer{Index: int32(i), Kind: m.kindOf(i).Name})
	}
	if m.ORT() {
		m.ortPlan(plan)
	}
	return plan, nil
}

// Build answers one part.
func (p Plugin) Build(_ context.Context, req *pb.BuildRequest) (*pb.BuildResponse, error) {
	m, err := p.load(req.GetModel(), req.GetOptions())
	if err != nil {
		return nil, err
	}
	dt, err := ComputeDType(req.GetOptions())
	if err != nil {
		return nil, err
	}
	a := m.arch
	domain := "strata." + p.Name
	switch req.GetPart() {
	case sdk.PartEmbed:
		return embedPart(domain, a.Name+"Embed", dt, weight.Tensor(m.Key("embed_tokens.weight"), int64(m.Vocab), int64(m.Hidden)), m.Embed, m.embedTableDType(dt), m.EmbedScale), nil
	case sdk.PartContext:
		if m.ORT() {
			return ortContextPart(domain, a.Name+"Context", dt, m.RoPE, m.ortContextLength), nil
		}
		return contextPart(domain, a.Name+"Context", dt, m.RoPE, req.GetOptions(), m.context, m.positions(), m.slotsCache()), nil
	case sdk.PartLayer:
		k, ok := m.kind(req.GetKind())
		if !ok {
			return nil, fmt.Errorf("%s has layer kinds %s; asked for %q", a.ModelType, m.kindNames(), req.GetKind())
		}
		return m.buildLayers(domain, dt, k, req.GetLayers())
	case sdk.PartFinal:
		if m.ORT() {
			return ortFinalPart(domain, a.Name+"Final", dt, m.norm(), m.FinalSoftCap, m.normWeight(), m.headWeight(), m.ortLastLogits()), nil
		}
		return finalPart(domain, a.Name+"Final", dt, m.norm(), m.FinalSoftCap, m.normWeight(), m.headWeight(), m.OutputHidden, m.positionRank()), nil
	case sdk.PartModel:
		build, ok := m.modelBuilders[req.GetModelName()]
		if !ok {
			return nil, fmt.Errorf("%s builds no model %q", a.ModelType, req.GetModelName())
		}
		return build(fn.NewFunc(domain, a.Name+exportedName(req.GetModelName()), dt))
	default:
		return nil, fmt.Errorf("%s has no part %q (parts: %s, %s, %s, %s, %s)", a.ModelType, req.GetPart(),
			sdk.PartEmbed, sdk.PartContext, sdk.PartLayer, sdk.PartFinal, sdk.PartModel)
	}
}

func exportedName(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// ExpectedTensors lists every tensor the plugin would bind for model's
// config, with its shape, without checking the inventory (which may be
// partial: it still tells layouts detected from the keys). For tests and
// tools that make checkpoints.
func (p Plugin) ExpectedTensors(model *pb.Model) ([]sdk.ExpectedTensor, error) {
	m, err := p.loadWith(model, nil, false)
	if err != nil {
		return nil, err
	}
	return m.expected()
}

// load parses the config for the model's architecture and runs its Load.
func (p Plugin) load(model *pb.Model, opts *pb.ExportOptions) (*Model, error) {
	return loaded.get(p, model, opts)
}

// loaded keeps this process's last loaded models. Every call of an export
// names the same *pb.Model (the host sends it once, the SDK hands out the
// one it remembers), and parsing the config and indexing the inventory at
// each call was a third of GLM-4.6's plugin time (44,689 tensors, 7 calls).
// A Model is only read after its Load, so calls may share one.
var loaded loads

type loads struct {
	mu   sync.Mutex
	last []loadedModel // newest first, at most keepLoaded
}

const keepLoaded = 4

type loadedModel struct {
	plugin *Architecture // &Plugin.Architectures[0]: which Plugin value
	model  *pb.Model
	opts   *pb.ExportOptions
	m      *Model
}

func (ls *loads) get(p Plugin, model *pb.Model, opts *pb.ExportOptions) (*Model, error) {
	if len(p.Architectures) == 0 {
		return p.loadWith(model, opts, true)
	}
	id := &p.Architectures[0]
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, l := range ls.last {
		if l.plugin == id && l.model == model && proto.Equal(l.opts, opts) {
			return l.m, nil
		}
	}
	// The inventory is the model's whatever the options: Check's (none)
	// serves Plan's and Build's (70,000 keys indexed once for Kimi-K2).
	var inv sdk.Inventory
	for _, l := range ls.last {
		if l.model == model {
			inv = l.m.Inventory
			break
		}
	}
	m, err := p.loadInventory(model, opts, true, inv)
	if err != nil {
		return nil, err
	}
	ls.last = append([]loadedModel{{id, model, opts, m}}, ls.last[:min(len(ls.last), keepLoaded-1)]...)
	return m, nil
}

func (p Plugin) loadWith(model *pb.Model, opts *pb.ExportOptions, checkLayers bool) (*Model, error) {
	return p.loadInventory(model, opts, checkLayers, nil)
}

// loadInventory is loadWith with model's inventory, made when inv is nil.
func (p Plugin) loadInventory(model *pb.Model, opts *pb.ExportOptions, checkLayers bool, inv sdk.Inventory) (*Model, error) {
	if inv == nil {
		inv = sdk.NewInventory(model)
	}
	c, err := hf.Parse(model.GetConfigJson())
	if err != nil {
		return nil, err
	}
	mt, err := c.String("model_type")
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(p.Architectures, func(a Architecture) bool { return a.ModelType == mt })
	if i < 0 {
		return nil, fmt.Errorf("plugin %s does not handle model_type %q", p.Name, mt)
	}
	a := p.Architectures[i]
	r := &hf.Reader{Config: c}
	if a.ConfigObject != "" {
		sub, ok := r.Object(a.ConfigObject)
		if !ok && r.Err == nil {
			return nil, fmt.Errorf("config.json: required object %q is missing", a.ConfigObject)
		}
		r = &hf.Reader{Config: sub, Err: r.Err}
	}
	withDefaults, defaulted, err := r.Config.WithDefaults(a.Defaults)
	if err != nil {
		return nil, fmt.Errorf("plugin %s, model_type %s: Architecture.Defaults: %w", p.Name, mt, err)
	}
	if r.Config = withDefaults; a.ConfigObject == "" {
		c = withDefaults
	}
	m := &Model{Reader: r, Top: c, arch: a, defaulted: defaulted, Inventory: inv, Export: opts,
		modelBuilders: map[string]func(*fn.Func) (*pb.BuildResponse, error){}}
	if m.Options, err = pluginOptions(opts, p.Name, a.Options); err != nil {
		return nil, err
	}
	if m.Prefix, err = m.layout(checkLayers); err != nil {
		return nil, err
	}
	m.Common = ParseCommon(r)
	if r.Err != nil {
		return nil, m.explainDefaults(r.Err)
	}
	if err := m.checkLayerCount(); checkLayers && err != nil {
		return nil, err
	}
	if err := a.Load(m); err != nil {
		return nil, m.explainDefaults(err)
	}
	if r.Err != nil {
		return nil, m.explainDefaults(r.Err)
	}
	if err := m.headLayout(checkLayers); err != nil {
		return nil, err
	}
	if len(m.kinds) == 0 {
		return nil, fmt.Errorf("plugin %s declares no layer kind for %s", p.Name, mt)
	}
	if err := m.checkPositionRank(); err != nil {
		return nil, err
	}
	if m.ORT() {
		if err := m.checkORT(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// LoadConfig loads configJSON as Check does, without a checkpoint: the
// architecture's Defaults applied, the common fields read, Load run (a Load
// that reads the tensor inventory finds it empty). For tests of a plugin's
// config reading: what a config that omits a field exports.
func (p Plugin) LoadConfig(configJSON []byte) (*Model, error) {
	return p.loadWith(&pb.Model{ConfigJson: configJSON}, nil, false)
}

// pluginOptions checks opts against the declared options and fills in
// defaults; an unknown key or a value not allowed is an error naming what is.
func pluginOptions(opts *pb.ExportOptions, plugin string, declared []*pb.PluginOption) (map[string]string, error) {
	out := map[string]string{}
	byName := map[string]*pb.PluginOption{}
	var names []string
	for _, o := range declared {
		out[o.GetName()] = o.GetDefaultValue()
		byName[o.GetName()] = o
		names = append(names, o.GetName())
	}
	slices.Sort(names)
	for k, v := range opts.GetPluginOptions() {
		o, ok := byName[k]
		if !ok {
			list := strings.Join(names, ", ")
			if list == "" {
				list = "none"
			}
			return nil, fmt.Errorf("plugin %s has no option %q (it has: %s)", plugin, k, list)
		}
		if allowed := o.GetAllowedValues(); len(allowed) > 0 && !slices.Contains(allowed, v) {
			return nil, fmt.Errorf("%s %q: use %s", k, v, strings.Join(allowed, " or "))
		}
		out[k] = v
	}
	return out, nil
}

// layout picks, of the architecture's prefixes, the one the checkpoint's
// layers are under (Architecture.Prefixes). A model that is not to be
// checked (ExpectedTensors, whose inventory may be empty or partial) with
// none of them gets the first.
func (m *Model) layout(checkLayers bool) (string, error) {
	prefixes := m.arch.prefixes()
	if len(prefixes) == 1 {
		return prefixes[0], nil // a missing layer is checkLayerCount's to name
	}
	p, err := m.Inventory.PickPrefix(m.arch.ModelType+"'s decoder layers", "layers.", prefixes)
	if errors.Is(err, sdk.ErrNoLayout) && !checkLayers {
		return prefixes[0], nil
	}
	if err != nil {
		return "", fmt.Errorf("%s checkpoint: %w", m.arch.ModelType, err)
	}
	return p, nil
}

// headLayout sets HeadKey, unless Load did, to the one of the
// architecture's HeadKeys the checkpoint holds; an untied model holding
// two of them is refused.
func (m *Model) headLayout(checkLayers bool) error {
	keys := m.arch.HeadKeys
	if m.HeadKey != "" || len(keys) == 0 {
		return nil
	}
	var held []string
	for _, k := range keys {
		if m.Inventory.Has(k) {
			held = append(held, k)
		}
	}
	switch {
	case len(held) == 1:
		m.HeadKey = held[0]
	case len(held) == 0:
		m.HeadKey = keys[0]
		if checkLayers && !m.Tied {
			return fmt.Errorf("%s checkpoint: the embeddings are untied (tie_word_embeddings false), but the checkpoint holds the head under none of %s: "+
				"export the checkpoint with its lm_head, or set tie_word_embeddings if the head is the embedding matrix", m.arch.ModelType, strings.Join(keys, ", "))
		}
	case m.Tied:
		m.HeadKey = held[0] // unread
	default:
		return fmt.Errorf("%s checkpoint: the checkpoint holds the untied head twice, as %s: keep one "+
			"(delete the other from the safetensors files, or load and save_pretrained it again with transformers)", m.arch.ModelType, strings.Join(held, " and "))
	}
	return nil
}
