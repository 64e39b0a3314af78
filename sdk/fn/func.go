// Package fn builds ONNX functions for architecture plugins: a small
// function builder (Func, Value, scopes that name nodes), thin helpers over
// single operators, and typed constants. The LLM blocks built with it live
// in sdk/blocks.
//
// A function built here is type-generic in its inputs like any ONNX function;
// only the constants it creates carry a dtype, the compute dtype the builder
// was made with.
package fn

import (
	"fmt"
	"sort"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Opset is the default-domain opset every strata graph is written against
// (the one the Qualcomm toolchain exports with).
const Opset = 17

// Value names one tensor inside a function body.
type Value string

// Func builds one ONNX FunctionProto. Copies made by Scope share the function
// and only differ in the prefix given to the names they create.
type Func struct {
	*state
	scope string
}

type state struct {
	fn     *onnxpb.FunctionProto
	dtype  DType
	opsets map[string]int64
	deps   map[string]*onnxpb.FunctionProto
	used   map[string]int
	consts map[string]Value // integer constants, made once per function
}

// NewFunc starts a function domain.name computing in dtype.
func NewFunc(domain, name string, dtype DType) *Func {
	return &Func{state: &state{
		fn:     &onnxpb.FunctionProto{Domain: domain, Name: name},
		dtype:  dtype,
		opsets: map[string]int64{"": Opset},
		deps:   map[string]*onnxpb.FunctionProto{},
		used:   map[string]int{},
		consts: map[string]Value{},
	}}
}

// DType is the compute dtype constants are created in.
func (f *Func) DType() DType { return f.dtype }

// Scope returns a view of f whose new names start with name/, so a reader of
// the graph sees which block a node belongs to.
func (f *Func) Scope(name string) *Func {
	if f.scope != "" {
		name = f.scope + "/" + name
	}
	return &Func{state: f.state, scope: name}
}

// Input declares the next formal input.
func (f *Func) Input(name string) Value {
	f.fn.Input = append(f.fn.Input, name)
	return Value(name)
}

// Attribute declares a function attribute without a default.
func (f *Func) Attribute(name string) {
	f.fn.Attribute = append(f.fn.Attribute, name)
}

// Output declares v as the next formal output called name, renaming the value
// everywhere it appears. A formal input cannot be renamed; it is passed
// through an Identity instead.
func (f *Func) Output(name string, v Value) {
	if f.isInput(v) {
		v = f.Op("Identity", []Value{v})
	}
	f.rename(v, Value(name))
	f.fn.Output = append(f.fn.Output, name)
}

func (f *Func) isInput(v Value) bool {
	for _, in := range f.fn.Input {
		if in == string(v) {
			return true
		}
	}
	return false
}

func (f *Func) rename(from, to Value) {
	for _, n := range f.fn.Node {
		for i, s := range n.Input {
			if s == string(from) {
				n.Input[i] = string(to)
			}
		}
		for i, s := range n.Output {
			if s == string(from) {
				n.Output[i] = string(to)
			}
		}
	}
}

// Use records that the body calls fn (a custom op shipped with its body):
// it is returned by Dependencies and its domain is imported.
func (f *Func) Use(fn *onnxpb.FunctionProto) {
	f.deps[fn.Domain+"::"+fn.Name] = fn
	f.opsets[fn.Domain] = 1
}

// Import imports an operator domain at version, for ops of that domain the
// body adds with OpN (ONNX Runtime's com.microsoft contrib ops).
func (f *Func) Import(domain string, version int64) { f.opsets[domain] = version }

// Proto finishes the function: opset imports are sorted so the result is
// byte-identical on every build.
func (f *Func) Proto() *onnxpb.FunctionProto {
	f.fn.OpsetImport = sortedOpsets(f.opsets)
	return f.fn
}

// Dependencies are the functions the body calls, sorted by domain and name.
func (f *Func) Dependencies() []*onnxpb.FunctionProto {
	keys := make([]string, 0, len(f.deps))
	for k := range f.deps {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*onnxpb.FunctionProto, len(keys))
	for i, k := range keys {
		out[i] = f.deps[k]
	}
	return out
}

func sortedOpsets(m map[string]int64) []*onnxpb.OperatorSetIdProto {
	domains := make([]string, 0, len(m))
	for d := range m {
		domains = append(domains, d)
	}
	sort.Strings(domains)
	out := make([]*onnxpb.OperatorSetIdProto, len(domains))
	for i, d := range domains {
		out[i] = &onnxpb.OperatorSetIdProto{Domain: d, Version: m[d]}
	}
	return out
}

// name returns a fresh value name: scope/hint, then scope/hint_1, ...
func (f *Func) name(hint string) string {
	base := hint
	if f.scope != "" {
		base = f.scope + "/" + hint
	}
	n := f.used[base]
	f.used[base] = n + 1
	if n == 0 {
		return base
	}
	return fmt.Sprintf("%s_%d", base, n)
}

// Op adds a node of the default domain with one output and returns it.
func (f *Func) Op(op string, inputs []Value, attrs ...*onnxpb.AttributeProto) Value {
	return f.OpN(op, "", 1, inputs, attrs...)[0]
}

// OpN adds a node of any domain with n outputs.
func (f *Func) OpN(op, domain string, n int, inputs []Value, attrs ...*onnxpb.AttributeProto) []Value {
	node := &onnxpb.NodeProto{OpType: op, Domain: domain, Attribute: attrs}
	node.Name = f.name(op)
	for _, in := range inputs {
		node.Input = append(node.Input, string(in))
	}
	outs := make([]Value, n)
	for i := range outs {
		if n == 1 {
			outs[i] = Value(node.Name)
		} else {
			outs[i] = Value(fmt.Sprintf("%s:%d", node.Name, i))
		}
		node.Output = append(node.Output, string(outs[i]))
	}
	f.fn.Node = append(f.fn.Node, node)
	return outs
}

// OpUsed is OpN naming only the outputs used says are used: the others
// are "", ONNX's absent optional output, which a kernel then skips.
func (f *Func) OpUsed(op, domain string, used []bool, inputs []Value, attrs ...*onnxpb.AttributeProto) []Value {
	outs := f.OpN(op, domain, len(used), inputs, attrs...)
	node := f.fn.Node[len(f.fn.Node)-1]
	for i, u := range used {
		if !u {
			outs[i], node.Output[i] = "", ""
		}
	}
	return outs
}

// Call adds a call of a function shipped with the model (see Use).
func (f *Func) Call(fn *onnxpb.FunctionProto, inputs []Value, attrs ...*onnxpb.AttributeProto) Value {
	f.Use(fn)
	return f.OpN(fn.Name, fn.Domain, 1, inputs, attrs...)[0]
}
