package refeval

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Run evaluates fn's body in order on inputs (one per formal input, by
// name) and returns its formal outputs by name. Nodes of other domains call
// the function of that domain and name in deps, with the call node's
// attributes bound to the callee's attribute references.
func Run(fn *onnxpb.FunctionProto, deps []*onnxpb.FunctionProto, inputs map[string]Tensor) (map[string]Tensor, error) {
	lib := map[string]*onnxpb.FunctionProto{}
	for _, d := range deps {
		lib[d.GetDomain()+"::"+d.GetName()] = d
	}
	for _, name := range fn.GetInput() {
		if _, ok := inputs[name]; !ok {
			return nil, fmt.Errorf("%s: input %q not given", fnName(fn), name)
		}
	}
	for name := range inputs {
		if !contains(fn.GetInput(), name) {
			return nil, fmt.Errorf("%s: %q is not a formal input (inputs: %s)", fnName(fn), name, strings.Join(fn.GetInput(), ", "))
		}
	}
	outs, err := call(fn, lib, inputs, nil, 0)
	if err != nil {
		return nil, err
	}
	res := map[string]Tensor{}
	for i, name := range fn.GetOutput() {
		res[name] = outs[i]
	}
	return res, nil
}

func fnName(fn *onnxpb.FunctionProto) string { return fn.GetDomain() + "::" + fn.GetName() }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// call runs fn's body with inputs by formal name and attrs given at the
// call site, returning the formal outputs in order.
func call(fn *onnxpb.FunctionProto, lib map[string]*onnxpb.FunctionProto, inputs map[string]Tensor,
	attrs map[string]*onnxpb.AttributeProto, depth int) ([]Tensor, error) {
	if depth > 32 {
		return nil, fmt.Errorf("%s: calls nested too deeply (recursion?)", fnName(fn))
	}
	// Defaults declared by the function, overridden by the call site.
	bound := map[string]*onnxpb.AttributeProto{}
	for _, a := range fn.GetAttributeProto() {
		bound[a.GetName()] = a
	}
	for k, a := range attrs {
		if !contains(fn.GetAttribute(), k) && bound[k] == nil {
			return nil, fmt.Errorf("%s: called with attribute %q it does not declare", fnName(fn), k)
		}
		bound[k] = a
	}
	env := map[string]Tensor{}
	for name, t := range inputs {
		if err := t.check(); err != nil {
			return nil, fmt.Errorf("%s: input %q: %w", fnName(fn), name, err)
		}
		t.round()
		env[name] = t
	}
	for _, nd := range fn.GetNode() {
		outs, err := evalNode(nd, env, lib, bound, depth)
		if err != nil {
			return nil, fmt.Errorf("%s: node %q (%s): %w", fnName(fn), nd.GetName(), nd.GetOpType(), err)
		}
		for i, name := range nd.GetOutput() {
			if name == "" {
				continue
			}
			if i >= len(outs) {
				return nil, fmt.Errorf("%s: node %q (%s) has %d outputs, %d named", fnName(fn), nd.GetName(), nd.GetOpType(), len(outs), len(nd.GetOutput()))
			}
			env[name] = outs[i]
		}
	}
	res := make([]Tensor, len(fn.GetOutput()))
	for i, name := range fn.GetOutput() {
		t, ok := env[name]
		if !ok {
			return nil, fmt.Errorf("%s: output %q is never computed", fnName(fn), name)
		}
		res[i] = t
	}
	return res, nil
}

func evalNode(nd *onnxpb.NodeProto, env map[string]Tensor, lib map[string]*onnxpb.FunctionProto,
	bound map[string]*onnxpb.AttributeProto, depth int) ([]Tensor, error) {
	n := &node{op: nd.GetOpType(), nOut: len(nd.GetOutput()), attrs: map[string]*onnxpb.AttributeProto{}}
	for _, a := range nd.GetAttribute() {
		if ref := a.GetRefAttrName(); ref != "" {
			val, ok := bound[ref]
			if !ok {
				continue // an unset reference leaves the attribute unset
			}
			if val.GetType() != a.GetType() && a.GetType() != onnxpb.AttributeProto_UNDEFINED {
				return nil, fmt.Errorf("attribute %q refers to %q of type %s, want %s", a.GetName(), ref, val.GetType(), a.GetType())
			}
			resolved := proto.Clone(val).(*onnxpb.AttributeProto)
			resolved.Name = a.GetName()
			resolved.RefAttrName = ""
			n.attrs[a.GetName()] = resolved
			continue
		}
		n.attrs[a.GetName()] = a
	}
	for _, name := range nd.GetInput() {
		if name == "" {
			n.in = append(n.in, nil)
			continue
		}
		t, ok := env[name]
		if !ok {
			return nil, fmt.Errorf("input %q is not computed before this node", name)
		}
		n.in = append(n.in, &t)
	}
	if d := nd.GetDomain(); d != "" && d != "ai.onnx" {
		callee := lib[d+"::"+nd.GetOpType()]
		if callee == nil {
			return nil, fmt.Errorf("no function %s::%s among the dependencies", d, nd.GetOpType())
		}
		if len(n.in) > len(callee.GetInput()) {
			return nil, fmt.Errorf("%d inputs for %d formal inputs", len(n.in), len(callee.GetInput()))
		}
		args := map[string]Tensor{}
		for i, formal := range callee.GetInput() {
			if i < len(n.in) && n.in[i] != nil {
				args[formal] = *n.in[i]
			}
		}
		return call(callee, lib, args, n.attrs, depth+1)
	}
	impl, ok := ops[n.op]
	if !ok {
		return nil, fmt.Errorf("op %q is not supported by refeval (supported: %s)", n.op, strings.Join(Ops(), " "))
	}
	outs, err := impl(n)
	if err != nil {
		return nil, err
	}
	for i := range outs {
		if err := outs[i].check(); err != nil {
			return nil, fmt.Errorf("bad result: %w", err)
		}
		outs[i].round()
	}
	return outs, nil
}

// Ops lists the default-domain ops refeval evaluates.
func Ops() []string {
	names := make([]string, 0, len(ops))
	for k := range ops {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// opFunc evaluates one node of the default domain.
type opFunc func(n *node) ([]Tensor, error)

var ops = map[string]opFunc{}

func register(fs map[string]opFunc) {
	for k, f := range fs {
		ops[k] = f
	}
}

// node is a node being evaluated: inputs (nil for an omitted optional one),
// resolved attributes and the number of outputs asked for.
type node struct {
	op    string
	in    []*Tensor
	nOut  int
	attrs map[string]*onnxpb.AttributeProto
}

// input i, which must be given.
func (n *node) input(i int) (Tensor, error) {
	if i >= len(n.in) || n.in[i] == nil {
		return Tensor{}, fmt.Errorf("input %d is required", i)
	}
	return *n.in[i], nil
}

// optional input i, or nil.
func (n *node) optional(i int) *Tensor {
	if i >= len(n.in) {
		return nil
	}
	return n.in[i]
}

func (n *node) attrInt(name string, def int64) int64 {
	if a, ok := n.attrs[name]; ok {
		return a.GetI()
	}
	return def
}

func (n *node) attrInts(name string) ([]int64, bool) {
	a, ok := n.attrs[name]
	if !ok {
		return nil, false
	}
	return a.GetInts(), true
}

func (n *node) attrFloat(name string, def float32) float32 {
	if a, ok := n.attrs[name]; ok {
		return a.GetF()
	}
	return def
}

func (n *node) attrString(name, def string) string {
	if a, ok := n.attrs[name]; ok {
		return string(a.GetS())
	}
	return def
}

// inputs checks the input count is within [min, max].
func (n *node) inputs(min, max int) error {
	if len(n.in) < min || len(n.in) > max {
		if min == max {
			return fmt.Errorf("takes %d inputs, got %d", min, len(n.in))
		}
		return fmt.Errorf("takes %d to %d inputs, got %d", min, max, len(n.in))
	}
	return nil
}

// one wraps a single result.
func one(t Tensor, err error) ([]Tensor, error) {
	if err != nil {
		return nil, err
	}
	return []Tensor{t}, nil
}
