// Package plugintest helps a plugin test itself without a host: models made
// from a config and the tensors it implies (also in another key layout), the
// plan's layer kinds, and a check of every part as the host will take it:
// each formal input passed by the host (batch_index and comp_ctx_lengths
// only with their options, and then read) or bound to a tensor the
// checkpoint holds, and no weight data inside the part (weight-free: weights
// reach it through its bindings alone).
package plugintest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// Config is base (a config.json) with edit applied to its fields.
func Config(t testing.TB, base string, edit func(map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(base), &m); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(m)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Checker answers Check (decoder.Plugin does).
type Checker interface {
	Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
}

// Check asks p whether it can export m: supported, and its reasons joined
// by ";" (a test looks for one in them).
func Check(t testing.TB, p Checker, m *pb.Model) (bool, string) {
	t.Helper()
	resp, err := p.Check(context.Background(), &pb.CheckRequest{Model: m})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetSupported(), strings.Join(resp.GetReasons(), ";")
}

// Expecter lists the tensors a plugin binds for a model (decoder.Plugin
// does).
type Expecter interface {
	ExpectedTensors(model *pb.Model) ([]sdk.ExpectedTensor, error)
}

// Model is a checkpoint as the host describes it: configJSON and the
// tensors arch expects of it, all of safetensors dtype dt. Seeds are
// tensors the plugin looks at to tell on-disk layouts apart; they are part
// of the inventory it is asked about. A config the plugin refuses gives a
// model with no tensors (Check then says why).
func Model(t testing.TB, arch Expecter, configJSON []byte, dt string, seeds ...*pb.TensorInfo) *pb.Model {
	t.Helper()
	want, err := arch.ExpectedTensors(&pb.Model{ConfigJson: configJSON, Tensors: seeds})
	if err != nil {
		return &pb.Model{ConfigJson: configJSON}
	}
	return FromTensors(configJSON, want, dt)
}

// Edited is Model of base with edit applied (see Config). When the plugin
// refuses the edited config, the tensors are those of base, so a test of a
// config error sees the plugin's reason, not missing tensors.
func Edited(t testing.TB, arch Expecter, base string, edit func(map[string]any), dt string, seeds ...*pb.TensorInfo) *pb.Model {
	t.Helper()
	data := Config(t, base, edit)
	m := Model(t, arch, data, dt, seeds...)
	if len(m.Tensors) == 0 {
		m.Tensors = Model(t, arch, []byte(base), dt, seeds...).Tensors
	}
	return m
}

// FromTensors is a model of configJSON holding tensors, all of dtype dt
// (each key once).
func FromTensors(configJSON []byte, tensors []sdk.ExpectedTensor, dt string) *pb.Model {
	m := &pb.Model{ConfigJson: configJSON}
	seen := map[string]bool{}
	for _, w := range tensors {
		if !seen[w.Key] {
			seen[w.Key] = true
			m.Tensors = append(m.Tensors, &pb.TensorInfo{Key: w.Key, Dtype: dt, Shape: w.Shape})
		}
	}
	return m
}

// Bindings maps one layer's formal weight inputs to the checkpoint keys
// they read (one key as stored, or every key of an expression in order).
type Bindings map[string][]string

// Kinds plans model with opts (nil: the defaults), failing t on an error,
// and returns the plan and each layer's kind in order.
func Kinds(t testing.TB, arch sdk.Architecture, model *pb.Model, opts *pb.ExportOptions) (*pb.PlanResponse, []string) {
	t.Helper()
	plan, err := arch.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: opts})
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	kinds := make([]string, len(plan.GetLayers()))
	for i, l := range plan.GetLayers() {
		kinds[i] = l.GetKind()
	}
	return plan, kinds
}

// RequireBound builds each part and fails t unless every formal input is a
// role the host binds or a weight bound, for every layer, to tensors the
// model holds (the model planned with the first part's options), and each
// part is weight-free (WeightFree). The serving inputs follow the options:
// batch_index is a role only with continuous_batching, and then every layer
// kind with a cache must read it and its caches hold full_batch_size rows;
// comp_ctx_lengths only with ccl, and then, when the context part is among
// the parts, it or a layer must read it (the rows attention reads). The parts are
// checked again with each of ServingOptions added to their options, the
// exports every plugin serves (--continuous-batching, --ccl). It returns
// each part's bindings by layer with the options given, for further checks.
func RequireBound(t testing.TB, arch sdk.Architecture, model *pb.Model, parts ...*pb.BuildRequest) []map[int32]Bindings {
	t.Helper()
	out := requireBound(t, arch, model, "", parts)
	if len(parts) == 0 {
		return out
	}
	given := parts[0].GetOptions()
	for _, serving := range ServingOptions {
		if serving.ContinuousBatching == given.GetContinuousBatching() && serving.Ccl == given.GetCcl() {
			continue
		}
		reqs := make([]*pb.BuildRequest, len(parts))
		for i, p := range parts {
			reqs[i] = proto.Clone(p).(*pb.BuildRequest)
			if reqs[i].Options == nil {
				reqs[i].Options = &pb.ExportOptions{}
			}
			reqs[i].Options.ContinuousBatching, reqs[i].Options.Ccl = serving.ContinuousBatching, serving.Ccl
		}
		requireBound(t, arch, model, servingLabel(serving), reqs)
	}
	return out
}

// ServingOptions are the serving modes every part must hold up in: none,
// continuous batching, ccl, both.
var ServingOptions = []*pb.ExportOptions{{}, {ContinuousBatching: true}, {Ccl: true}, {ContinuousBatching: true, Ccl: true}}

// servingLabel starts what is reported of a part built with opts' serving
// options.
func servingLabel(opts *pb.ExportOptions) string {
	var on []string
	if opts.GetContinuousBatching() {
		on = append(on, "continuous batching")
	}
	if opts.GetCcl() {
		on = append(on, "ccl")
	}
	if len(on) == 0 {
		return "without serving options: "
	}
	return "with " + strings.Join(on, " and ") + ": "
}

// requireBound is RequireBound with the parts' options alone, each problem
// reported after label.
func requireBound(t testing.TB, arch sdk.Architecture, model *pb.Model, label string, parts []*pb.BuildRequest) []map[int32]Bindings {
	t.Helper()
	t = labelled{t, label}
	inv := sdk.NewInventory(model)
	roles := map[string]bool{sdk.InputIDs: true, sdk.PositionIDs: true, sdk.HiddenStates: true}
	for _, c := range decoder.StandardContext {
		roles[c] = true
	}
	var opts *pb.ExportOptions // the parts' options plan the model (its extra inputs, context values)
	if len(parts) > 0 {
		opts = parts[0].GetOptions()
	}
	plan, _ := Kinds(t, arch, model, opts)
	for _, c := range plan.GetContextOutputs() {
		roles[c] = true
	}
	for _, x := range plan.GetExtraInputs() {
		roles[x.GetName()] = true
	}
	caches := map[string][]*pb.CacheSpec{}
	for _, k := range plan.GetKinds() {
		caches[k.GetName()] = k.GetCaches()
		for _, c := range k.GetCaches() {
			roles[c.GetName()] = true
		}
	}
	serving := Serving(opts)
	for name := range serving {
		roles[name] = true
	}
	if opts.GetContinuousBatching() {
		for kind, cs := range caches {
			for _, c := range cs {
				if d := c.GetShape(); len(d) == 0 || d[0].GetParam() != "full_batch_size" {
					t.Errorf("kind %s: cache %s has shape %v; with continuous batching its rows are full_batch_size (decoder.KVCaches)", kind, c.GetName(), d)
				}
			}
		}
	}
	cclRead, cclWanted := false, false
	var out []map[int32]Bindings
	for _, req := range parts {
		req.Model = model
		resp, err := arch.Build(context.Background(), req)
		if err != nil {
			t.Fatalf("build %s %s: %v", req.GetPart(), req.GetKind(), err)
		}
		inputs := resp.GetFunction().GetInput()
		for _, name := range []string{sdk.BatchIndex, sdk.CompCtxLengths} {
			if slices.Contains(inputs, name) && !serving[name] {
				t.Errorf("%s %s reads %s, which the host passes only with %s", req.GetPart(), req.GetKind(), name, servingOption[name])
			}
		}
		if req.GetPart() == sdk.PartLayer && opts.GetContinuousBatching() && len(caches[req.GetKind()]) > 0 && !slices.Contains(inputs, sdk.BatchIndex) {
			t.Errorf("layer kind %s has caches but does not read %s: with continuous batching each row must write and read its own cache row (blocks.AttentionContext.BatchIndex)", req.GetKind(), sdk.BatchIndex)
		}
		if req.GetPart() == sdk.PartContext || req.GetPart() == sdk.PartLayer {
			cclWanted = cclWanted || req.GetPart() == sdk.PartContext // the rows are the context's to count, or the layers'
			cclRead = cclRead || slices.Contains(inputs, sdk.CompCtxLengths)
		}
		for _, problem := range WeightFree(resp, inv) {
			t.Errorf("%s %s: %s", req.GetPart(), req.GetKind(), problem)
		}
		byLayer := map[int32]Bindings{}
		for _, lw := range resp.GetWeights() {
			bound := Bindings{}
			for _, b := range lw.GetBindings() {
				keys := BindingKeys(b)
				for _, k := range keys {
					if !inv.Has(k) {
						t.Errorf("%s layer %d binds %s, not in the checkpoint", req.GetPart(), lw.GetLayer(), k)
					}
				}
				bound[b.GetInput()] = keys
			}
			for _, in := range resp.GetFunction().GetInput() {
				if !roles[in] && bound[in] == nil {
					t.Errorf("%s layer %d: input %s is neither a role nor bound", req.GetPart(), lw.GetLayer(), in)
				}
			}
			byLayer[lw.GetLayer()] = bound
		}
		out = append(out, byLayer)
	}
	if opts.GetCcl() && cclWanted && !cclRead {
		t.Errorf("with ccl, no part built reads %s: attention would read every cache row, not as many as its length says (blocks.CacheSlots)", sdk.CompCtxLengths)
	}
	return out
}

// servingOption names the option each serving input comes with.
var servingOption = map[string]string{sdk.BatchIndex: "continuous_batching (--continuous-batching)", sdk.CompCtxLengths: "ccl (--ccl)"}

// Serving is the serving inputs opts makes the host pass: batch_index with
// continuous batching, comp_ctx_lengths with ccl.
func Serving(opts *pb.ExportOptions) map[string]bool {
	out := map[string]bool{}
	if opts.GetContinuousBatching() {
		out[sdk.BatchIndex] = true
	}
	if opts.GetCcl() {
		out[sdk.CompCtxLengths] = true
	}
	return out
}

// MaxInlineElements is the most elements a constant inside a part may
// hold: RoPE frequencies, index tables and scalars are far smaller; more is
// data that belongs in the checkpoint, bound as a weight.
const MaxInlineElements = 1 << 16

// WeightFree lists what makes resp's functions (the part and the functions
// it calls) hold weight data instead of reading it through their bindings:
// a constant tensor (a node attribute, at any depth of subgraphs) larger
// than MaxInlineElements, or shaped like a checkpoint tensor of inv (16
// elements or more: a weight copied into the graph); a tensor with external
// data; an initializer in a subgraph. Empty when the part is weight-free.
func WeightFree(resp *pb.BuildResponse, inv sdk.Inventory) []string {
	shapes := map[string]string{} // shape -> a key of that shape
	for k, t := range inv {
		if n := elements(t.GetShape()); n >= 16 {
			if s := fmt.Sprint(t.GetShape()); shapes[s] == "" || k < shapes[s] {
				shapes[s] = k
			}
		}
	}
	var problems []string
	tensor := func(where string, t *onnxpb.TensorProto) {
		n := elements(t.GetDims())
		switch {
		case t.GetDataLocation() == onnxpb.TensorProto_EXTERNAL || len(t.GetExternalData()) > 0:
			problems = append(problems, fmt.Sprintf("%s: a constant with external data: a part holds no data; bind the checkpoint tensor as a weight (a formal input and its binding)", where))
		case n > MaxInlineElements:
			problems = append(problems, fmt.Sprintf("%s: a constant of %d elements %v (more than %d): weight data inside the part; bind the checkpoint tensor as a weight, or compute it in the graph", where, n, t.GetDims(), MaxInlineElements))
		case shapes[fmt.Sprint(t.GetDims())] != "" && len(t.GetDims()) > 0:
			problems = append(problems, fmt.Sprintf("%s: a constant of shape %v, the shape of checkpoint tensor %s: a weight copied into the part; bind it instead (a formal input and its binding)", where, t.GetDims(), shapes[fmt.Sprint(t.GetDims())]))
		}
	}
	var nodes func(fn string, ns []*onnxpb.NodeProto)
	nodes = func(fn string, ns []*onnxpb.NodeProto) {
		for _, n := range ns {
			where := fmt.Sprintf("%snode %q (%s)", fn, n.GetName(), n.GetOpType())
			for _, a := range n.GetAttribute() {
				at := where + " attribute " + a.GetName()
				if a.GetT() != nil {
					tensor(at, a.GetT())
				}
				for _, t := range a.GetTensors() {
					tensor(at, t)
				}
				if n := max(len(a.GetFloats()), len(a.GetInts()), len(a.GetStrings())); n > MaxInlineElements {
					problems = append(problems, fmt.Sprintf("%s: a list of %d values (more than %d): weight data inside the part; bind it as a weight", at, n, MaxInlineElements))
				}
				for _, g := range append([]*onnxpb.GraphProto{a.GetG()}, a.GetGraphs()...) {
					if g == nil {
						continue
					}
					for _, init := range g.GetInitializer() {
						problems = append(problems, fmt.Sprintf("%s: subgraph initializer %q: a part holds no initializers; bind weights, make constants Constant nodes", at, init.GetName()))
					}
					nodes(fn, g.GetNode())
				}
			}
		}
	}
	nodes("", resp.GetFunction().GetNode())
	for _, dep := range resp.GetDependencies() {
		nodes(fmt.Sprintf("function %s it calls: ", dep.GetName()), dep.GetNode())
	}
	return problems
}

// elements is the number of elements of a tensor of dims (1 for a scalar).
func elements(dims []int64) int64 {
	n := int64(1)
	for _, d := range dims {
		n *= d
	}
	return n
}

// BindingKeys lists the checkpoint keys a binding reads, in order.
func BindingKeys(b *pb.WeightBinding) []string {
	if b.GetWeight() == nil {
		return []string{b.GetKey()}
	}
	var keys []string
	var walk func(w *pb.Weight)
	walk = func(w *pb.Weight) {
		if w.GetKey() != "" {
			keys = append(keys, w.GetKey())
		}
		for _, a := range w.GetArgs() {
			walk(a)
		}
	}
	walk(b.GetWeight())
	return keys
}

// Rekeyed is model with its tensors' keys rewritten: each key starting with
// a from of pairs (from, to, from, to, …; the first that matches) has it
// replaced by its to. A test of another on-disk layout of the same
// checkpoint (Architecture.Prefixes): Rekeyed(m, "language_model.model.",
// "model.language_model.", "language_model.lm_head.", "lm_head.").
func Rekeyed(model *pb.Model, pairs ...string) *pb.Model {
	if len(pairs)%2 != 0 {
		panic("plugintest.Rekeyed: pairs must be (from, to) pairs")
	}
	out := &pb.Model{ConfigJson: model.GetConfigJson()}
	for _, t := range model.GetTensors() {
		c := proto.Clone(t).(*pb.TensorInfo)
		for i := 0; i < len(pairs); i += 2 {
			if rest, ok := strings.CutPrefix(c.Key, pairs[i]); ok {
				c.Key = pairs[i+1] + rest
				break
			}
		}
		out.Tensors = append(out.Tensors, c)
	}
	return out
}

// labelled reports t's problems after a label.
type labelled struct {
	testing.TB
	label string
}

func (l labelled) Errorf(format string, args ...any) {
	l.TB.Helper()
	l.TB.Errorf("%s%s", l.label, fmt.Sprintf(format, args...))
}

func (l labelled) Fatalf(format string, args ...any) {
	l.TB.Helper()
	l.TB.Fatalf("%s%s", l.label, fmt.Sprintf(format, args...))
}

// DraftBound builds the separate model name (an MTP draft, part "model")
// and requires every binding to read tensors the checkpoint holds and every
// formal input to be one of graphInputs or bound. It returns the keys each
// input reads.
func DraftBound(t testing.TB, arch sdk.Architecture, model *pb.Model, opts *pb.ExportOptions, name string, graphInputs ...string) map[string][]string {
	t.Helper()
	resp, err := arch.Build(context.Background(), &pb.BuildRequest{Model: model, Options: opts, Part: sdk.PartModel, ModelName: name})
	if err != nil {
		t.Fatalf("build %s: %v", name, err)
	}
	inv := sdk.NewInventory(model)
	bound := map[string][]string{}
	for _, b := range resp.GetWeights()[0].GetBindings() {
		bound[b.GetInput()] = BindingKeys(b)
		for _, k := range bound[b.GetInput()] {
			if !inv.Has(k) {
				t.Errorf("%s binds %s, not in the checkpoint", name, k)
			}
		}
	}
	for _, in := range resp.GetFunction().GetInput() {
		if !slices.Contains(graphInputs, in) && bound[in] == nil {
			t.Errorf("%s input %s is neither a graph input nor bound", name, in)
		}
	}
	return bound
}
