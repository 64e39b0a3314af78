package graph

import (
	"testing"

	"google.golang.org/protobuf/proto"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// inlined keeps every field of the node but its name, inputs and outputs
// (which Inline fills in): the test fails when NodeProto gains a field
// inlined does not copy.
func TestInlinedCopiesEveryField(t *testing.T) {
	n := &onnxpb.NodeProto{Input: []string{"x", ""}, Output: []string{"y"}, Name: "n", OpType: "Op", Domain: "d", Overload: "o",
		Attribute: []*onnxpb.AttributeProto{{Name: "axis", Type: onnxpb.AttributeProto_INT, I: 1}}, DocString: "doc",
		MetadataProps: []*onnxpb.StringStringEntryProto{{Key: "k", Value: "v"}}}
	n.ProtoReflect().SetUnknown([]byte{0x98, 0x06, 0x01}) // field 99, varint 1
	fields := n.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if !n.ProtoReflect().Has(fields.Get(i)) {
			t.Fatalf("the test node leaves field %s unset", fields.Get(i).Name())
		}
	}
	cp := inlined(n, n.GetName())
	copy(cp.Input, n.Input)
	copy(cp.Output, n.Output)
	if !proto.Equal(cp, n) {
		t.Errorf("inlined gives %v, want %v", cp, n)
	}
	cp.Input[0] = "renamed"
	if n.Input[0] != "x" {
		t.Error("the inlined node shares its inputs with the function's")
	}
}
