package graph

import (
	"fmt"
	"slices"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Call places one part function in the graph.
type Call struct {
	Fn *onnxpb.FunctionProto
	// Inputs and Outputs map the function's formal names to graph values.
	Inputs, Outputs map[string]string
	// Prefix names the call's internal values and nodes: "layers.3".
	Prefix string
}

// Inline copies the function body into the graph: formal inputs and outputs
// become the bound graph values, every other value and node name gets the
// call's prefix. Custom ops the body calls stay calls.
//
// The caller binds every formal input and output and nothing else: the
// host validates a plugin's parts against the bindings it makes before
// placing them (host/export/validate.go), once per part rather than here
// once per call.
func (b *Builder) Inline(c Call) error {
	for _, op := range c.Fn.GetOpsetImport() {
		if err := b.Import(op.GetDomain(), op.GetVersion()); err != nil {
			return fmt.Errorf("%s: %w", c.Fn.GetName(), err)
		}
	}
	rename := func(v string) string {
		if v == "" {
			return ""
		}
		if actual, ok := c.Inputs[v]; ok {
			return actual
		}
		if actual, ok := c.Outputs[v]; ok {
			return actual
		}
		return c.Prefix + "/" + v
	}
	for _, n := range c.Fn.GetNode() {
		if err := checkInlinable(n); err != nil {
			return fmt.Errorf("%s: node %s: %w", c.Fn.GetName(), n.GetName(), err)
		}
		cp := inlined(n, c.Prefix+"/"+n.GetName())
		for i, v := range n.Input {
			cp.Input[i] = rename(v)
		}
		for i, v := range n.Output {
			cp.Output[i] = rename(v)
		}
		b.graph.Node = append(b.graph.Node, cp)
	}
	return nil
}

// inlined is n renamed, with inputs and outputs to fill in. The attributes
// are shared with n, never changed (a deep copy of every node was a fifth of
// the stitched GLM-4.6's heap).
func inlined(n *onnxpb.NodeProto, name string) *onnxpb.NodeProto {
	cp := &onnxpb.NodeProto{Name: name, OpType: n.GetOpType(), Domain: n.GetDomain(), Overload: n.GetOverload(),
		Attribute: n.GetAttribute(), DocString: n.GetDocString(), MetadataProps: n.GetMetadataProps(),
		Input: make([]string, len(n.GetInput())), Output: make([]string, len(n.GetOutput()))}
	if u := n.ProtoReflect().GetUnknown(); len(u) > 0 { // fields of a newer ONNX
		cp.ProtoReflect().SetUnknown(slices.Clone(u))
	}
	return cp
}

// checkInlinable refuses what a plain copy would get wrong: references to
// function attributes and nested graphs. Part functions have neither.
func checkInlinable(n *onnxpb.NodeProto) error {
	for _, a := range n.GetAttribute() {
		if a.GetRefAttrName() != "" {
			return fmt.Errorf("attribute %s refers to a function attribute, which parts may not have", a.GetName())
		}
		if a.GetG() != nil || len(a.GetGraphs()) > 0 {
			return fmt.Errorf("attribute %s holds a subgraph, which parts may not have", a.GetName())
		}
	}
	return nil
}

// CallFunction places the part as a call of a model-local function: the
// function ships with the model once and each call passes its weights as
// inputs (--subfunctions). The node is named by the call's prefix. The
// caller binds every formal input and output, as for Inline.
func (b *Builder) CallFunction(c Call) error {
	if err := b.AddFunction(c.Fn); err != nil {
		return err
	}
	node := &onnxpb.NodeProto{Name: c.Prefix, OpType: c.Fn.GetName(), Domain: c.Fn.GetDomain()}
	for _, in := range c.Fn.GetInput() {
		node.Input = append(node.Input, c.Inputs[in])
	}
	for _, out := range c.Fn.GetOutput() {
		node.Output = append(node.Output, c.Outputs[out])
	}
	b.graph.Node = append(b.graph.Node, node)
	return nil
}
