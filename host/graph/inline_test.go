package graph

import (
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

func part() *onnxpb.FunctionProto {
	f := fn.NewFunc("d", "Part", fn.Float32)
	x, w := f.Input("x"), f.Input("w")
	f.Output("y", f.Scope("blk").Mul(f.Add(x, w), w))
	return f.Proto()
}

func TestInlineRenames(t *testing.T) {
	b := New("g")
	err := b.Inline(Call{Fn: part(), Prefix: "layers.3",
		Inputs: map[string]string{"x": "hidden", "w": "weight::float32"}, Outputs: map[string]string{"y": "out"}})
	if err != nil {
		t.Fatal(err)
	}
	nodes := b.graph.GetNode()
	if len(nodes) != 2 {
		t.Fatalf("%d nodes, want 2", len(nodes))
	}
	add, mul := nodes[0], nodes[1]
	if !slices.Equal(add.GetInput(), []string{"hidden", "weight::float32"}) || add.GetOutput()[0] != "layers.3/Add" {
		t.Errorf("Add: %v -> %v", add.GetInput(), add.GetOutput())
	}
	if !slices.Equal(mul.GetInput(), []string{"layers.3/Add", "weight::float32"}) || mul.GetOutput()[0] != "out" {
		t.Errorf("Mul: %v -> %v", mul.GetInput(), mul.GetOutput())
	}
	if mul.GetName() != "layers.3/blk/Mul" {
		t.Errorf("node name %q", mul.GetName())
	}
	if b.opsets[""] != fn.Opset {
		t.Errorf("default opset not imported: %v", b.opsets)
	}
}

func TestInlineRefusesLooseBindings(t *testing.T) {
	cases := map[string]struct {
		in, out map[string]string
		want    string
	}{
		"unbound input": {map[string]string{"x": "a"}, map[string]string{"y": "b"}, "input w is not bound"},
		"unused output": {map[string]string{"x": "a", "w": "c"}, map[string]string{}, "output y is not used"},
		"extra binding": {map[string]string{"x": "a", "w": "c", "z": "d"}, map[string]string{"y": "b"}, "z is bound but is no formal"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := New("g").Inline(Call{Fn: part(), Prefix: "p", Inputs: tc.in, Outputs: tc.out})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestFunctionsMustAgree(t *testing.T) {
	b := New("g")
	if err := b.AddFunction(blocks.CtxScatterFunc()); err != nil {
		t.Fatal(err)
	}
	if err := b.AddFunction(blocks.CtxScatterFunc()); err != nil {
		t.Errorf("the same function twice: %v", err)
	}
	other := blocks.CtxGatherFunc()
	other.Name = "CtxScatter"
	if err := b.AddFunction(other); err == nil || !strings.Contains(err.Error(), "two different definitions") {
		t.Errorf("conflicting definitions accepted: %v", err)
	}
	if err := b.Import("", 18); err == nil {
		t.Error("opset 17 and 18 of one domain accepted")
	}
}
