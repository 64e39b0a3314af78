// Package plugintest helps a plugin test itself without a host: models made
// from a config and the tensors it implies, and a check that every part's
// formal inputs are bound.
package plugintest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/decoder"
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

// RequireBound builds each part and fails t unless every formal input is a
// role the host binds or a weight bound, for every layer, to tensors the
// model holds (the model planned with the first part's options). It returns
// each part's bindings by layer, for further checks.
func RequireBound(t testing.TB, arch sdk.Architecture, model *pb.Model, parts ...*pb.BuildRequest) []map[int32]Bindings {
	t.Helper()
	inv := sdk.NewInventory(model)
	roles := map[string]bool{sdk.InputIDs: true, sdk.PositionIDs: true, sdk.HiddenStates: true,
		decoder.PastKey: true, decoder.PastValue: true}
	for _, c := range decoder.StandardContext {
		roles[c] = true
	}
	var opts *pb.ExportOptions // the parts' options plan the model (its extra inputs, context values)
	if len(parts) > 0 {
		opts = parts[0].GetOptions()
	}
	plan, err := arch.Plan(context.Background(), &pb.PlanRequest{Model: model, Options: opts})
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	for _, c := range plan.GetContextOutputs() {
		roles[c] = true
	}
	for _, x := range plan.GetExtraInputs() {
		roles[x.GetName()] = true
	}
	for _, k := range plan.GetKinds() { // caches beyond the KV cache (linear attention's states)
		for _, c := range k.GetCaches() {
			roles[c.GetName()] = true
		}
	}
	var out []map[int32]Bindings
	for _, req := range parts {
		req.Model = model
		resp, err := arch.Build(context.Background(), req)
		if err != nil {
			t.Fatalf("build %s %s: %v", req.GetPart(), req.GetKind(), err)
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
	return out
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
