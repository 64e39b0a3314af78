package graph

import (
	"slices"
	"testing"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

func node(op, name string, in, out []string, attrs ...*onnxpb.AttributeProto) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{OpType: op, Name: name, Input: in, Output: out, Attribute: attrs}
}

func intAttr(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: name, Type: onnxpb.AttributeProto_INT, I: v}
}

// TestFuseResidualNorms: a sum between parts and the next part's norm of
// it become one SkipSimplifiedLayerNormalization in the norm's place,
// the sum its output 3 for the other readers; a sum read before its norm,
// a norm of another kind and an Add that is not a sum between parts stay.
func TestFuseResidualNorms(t *testing.T) {
	norm := func(name, x, w, y string, attrs ...*onnxpb.AttributeProto) *onnxpb.NodeProto {
		return node("SimplifiedLayerNormalization", name, []string{x, w}, []string{y}, append([]*onnxpb.AttributeProto{intAttr("axis", -1), intAttr("stash_type", 1)}, attrs...)...)
	}
	b := New("t")
	for _, n := range []*onnxpb.NodeProto{
		node("Add", "l0/add", []string{"h0", "mlp0"}, []string{"l0/out"}),
		node("Cast", "l1/cast", []string{"w1_bf16"}, []string{"w1"}),
		norm("l1/norm", "l0/out", "w1", "l1/normed"),
		node("Add", "l1/add", []string{"l0/out", "attn1"}, []string{"l1/mid"}), // reads the sum after its norm
		node("Add", "l1/add2", []string{"l1/mid", "mlp1"}, []string{"l1/out"}),
		node("Relu", "l2/reader", []string{"l1/out"}, []string{"r"}), // reads the sum before its norm
		norm("l2/norm", "l1/out", "w2", "l2/normed"),
		node("Add", "l2/add", []string{"l2/normed", "bias"}, []string{"l2/out"}),
		norm("final/norm", "l2/out", "w3", "y", intAttr("axis", 1)),
	} {
		b.Node(n)
	}
	n, err := b.FuseResidualNorms(map[string]bool{"l0/out": true, "l1/out": true, "l2/out": true})
	if err != nil || n != 1 {
		t.Fatalf("fused %d (%v), want 1", n, err)
	}
	var ops []string
	for _, n := range b.graph.GetNode() {
		ops = append(ops, n.GetOpType())
	}
	want := []string{"Cast", "SkipSimplifiedLayerNormalization", "Add", "Add", "Relu", "SimplifiedLayerNormalization", "Add", "SimplifiedLayerNormalization"}
	if !slices.Equal(ops, want) {
		t.Fatalf("ops %v, want %v", ops, want)
	}
	f := b.graph.GetNode()[1]
	if f.GetDomain() != msDomain || !slices.Equal(f.GetInput(), []string{"h0", "mlp0", "w1"}) || !slices.Equal(f.GetOutput(), []string{"l1/normed", "", "", "l0/out"}) {
		t.Errorf("fused node %v", f)
	}
	if a := f.GetAttribute(); len(a) != 1 || a[0].GetName() != "epsilon" || a[0].GetF() != 1e-5 {
		t.Errorf("fused node's attributes %v, want the norm's default epsilon 1e-5 spelled out", a)
	}
	if b.opsets[msDomain] != 1 {
		t.Errorf("opsets %v: com.microsoft not imported", b.opsets)
	}
}
