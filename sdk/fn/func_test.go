package fn

import (
	"slices"
	"testing"
)

func TestFuncOutputsRenameProducers(t *testing.T) {
	f := NewFunc("d", "F", Float32)
	x := f.Input("x")
	y := f.Scope("blk").Add(x, f.Int(1))
	z := f.Mul(y, y)
	f.Output("y_out", y)
	f.Output("z_out", z)
	f.Output("x_out", x) // a formal input passes through an Identity
	fn := f.Proto()
	if !slices.Equal(fn.GetOutput(), []string{"y_out", "z_out", "x_out"}) {
		t.Fatalf("outputs %v", fn.GetOutput())
	}
	produced := map[string]bool{}
	for _, n := range fn.GetNode() {
		for _, in := range n.GetInput() {
			if in != "x" && !produced[in] {
				t.Errorf("node %s reads %s before anything produces it", n.GetName(), in)
			}
		}
		for _, out := range n.GetOutput() {
			produced[out] = true
		}
	}
	for _, out := range fn.GetOutput() {
		if !produced[out] {
			t.Errorf("output %s is produced by no node", out)
		}
	}
	if fn.GetNode()[1].GetName() != "blk/Add" {
		t.Errorf("scoped node named %q, want blk/Add", fn.GetNode()[1].GetName())
	}
}

func TestIntegerConstantsAreShared(t *testing.T) {
	f := NewFunc("d", "F", Float32)
	a, b := f.Ints(0, 1), f.Scope("other").Ints(0, 1)
	if a != b {
		t.Errorf("the same constant made twice: %s and %s", a, b)
	}
	if f.Ints(1, 0) == a || f.Int(0) == f.Ints(0) {
		t.Error("different constants shared a node")
	}
}
