// Package plugintest helps a plugin test itself without a host: models made
// from a config and the tensors it implies, and a check that every part's
// formal inputs are bound.
package plugintest

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/build"
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

// Model is a checkpoint as the host describes it: configJSON and an
// inventory of tensors, all of safetensors dtype dt.
func Model(configJSON []byte, tensors []sdk.ExpectedTensor, dt string) *pb.Model {
	m := &pb.Model{ConfigJson: configJSON}
	for _, w := range tensors {
		m.Tensors = append(m.Tensors, &pb.TensorInfo{Key: w.Key, Dtype: dt, Shape: w.Shape})
	}
	return m
}

// Bindings maps one layer's formal weight inputs to the checkpoint keys
// they read (one key as stored, or every key of an expression in order).
type Bindings map[string][]string

// RequireBound builds each part and fails t unless every formal input is a
// role the host binds or a weight bound, for every layer, to tensors the
// model holds. It returns each part's bindings by layer, for further checks.
func RequireBound(t testing.TB, arch sdk.Architecture, model *pb.Model, parts ...*pb.BuildRequest) []map[int32]Bindings {
	t.Helper()
	inv := sdk.NewInventory(model)
	roles := map[string]bool{sdk.InputIDs: true, sdk.PositionIDs: true, sdk.HiddenStates: true,
		build.PastKey: true, build.PastValue: true}
	for _, c := range build.ContextOutputs {
		roles[c] = true
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
