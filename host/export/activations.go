package export

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/host/quant"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// Activation quantisation is the checkpoint's, not the architecture's: a
// plugin multiplies its input by a weight; when the checkpoint quantises
// that weight's layer inputs (compressed-tensors FP8_DYNAMIC), the host
// quantises the MatMul's other operand the same way, in every part that
// binds such a weight. Plugins write nothing for it.

// shapeOps move or select a weight's elements without computing on them:
// a MatMul whose B operand comes through them multiplies by the weight.
var shapeOps = map[string]bool{"Transpose": true, "Reshape": true, "Gather": true, "Slice": true, "Split": true,
	"Squeeze": true, "Unsqueeze": true, "Cast": true, "Identity": true, "Expand": true, "Concat": true, "Flatten": true}

// quantizeActivations rewrites resp's function so that each MatMul by a
// weight whose inputs the checkpoint quantises first quantises its other
// operand — following the weight into the local functions the part calls
// (an MTP draft calling its layer) — and ships the quantising function as
// a dependency.
func quantizeActivations(resp *pb.BuildResponse, q *quant.View) error {
	schemes, err := activationSchemes(resp, q)
	if err != nil || len(schemes) == 0 {
		return err
	}
	r := &actRewrite{deps: map[string]*onnxpb.FunctionProto{}, done: map[string]string{}, quantizer: blocks.FP8DynamicPerTokenFunc()}
	for _, d := range resp.GetDependencies() {
		r.deps[d.GetDomain()+"::"+d.GetName()] = d
	}
	if err := r.function(resp.GetFunction(), schemes); err != nil {
		return err
	}
	resp.Dependencies = append(resp.Dependencies, r.quantizer)
	return nil
}

// actRewrite rewrites a part's function and the local functions it calls.
type actRewrite struct {
	deps      map[string]*onnxpb.FunctionProto // the part's local functions by domain::name
	done      map[string]string                // local functions rewritten, with their schemes
	quantizer *onnxpb.FunctionProto
}

// function rewrites fn, whose formal inputs in schemes carry weights whose
// layer inputs are quantised.
func (r *actRewrite) function(fn *onnxpb.FunctionProto, schemes map[string]string) error {
	derived := map[string]string{} // value -> the weight input it carries
	for input, scheme := range schemes {
		if scheme != quant.ActivationFP8PerToken {
			return fmt.Errorf("%s: input %s: activation quantisation %q is not implemented", fn.GetName(), input, scheme)
		}
		derived[input] = input
	}
	quantized := map[string]string{} // activation -> its quantised value
	used := map[string]bool{}
	var nodes []*onnxpb.NodeProto
	for _, n := range fn.GetNode() {
		from, carries := carried(n, derived)
		callee := r.deps[n.GetDomain()+"::"+n.GetOpType()]
		switch {
		case !carries:
		case (n.GetOpType() == "MatMul" || n.GetOpType() == "Gemm") && n.GetDomain() == "" && derived[n.Input[0]] == "":
			x := n.Input[0]
			if _, done := quantized[x]; !done {
				call := &onnxpb.NodeProto{Name: "actquant/" + x, OpType: r.quantizer.GetName(), Domain: r.quantizer.GetDomain(),
					Input: []string{x}, Output: []string{"actquant/" + x}}
				nodes = append(nodes, call)
				quantized[x] = call.Output[0]
			}
			n.Input[0] = quantized[x]
			used[from] = true
		case shapeOps[n.GetOpType()] && n.GetDomain() == "":
			for _, out := range n.GetOutput() {
				derived[out] = from
			}
		case callee != nil:
			if err := r.call(n, callee, derived, schemes); err != nil {
				return err
			}
			for _, in := range n.GetInput() {
				used[derived[in]] = used[derived[in]] || derived[in] != ""
			}
		default:
			return fmt.Errorf("%s: weight input %s, whose layer inputs the checkpoint quantises (%s), reaches a %s node %s; strata quantises the activations of MatMul operands only",
				fn.GetName(), from, schemes[from], n.GetOpType(), n.GetName())
		}
		nodes = append(nodes, n)
	}
	for input := range schemes {
		if !used[input] {
			return fmt.Errorf("%s: weight input %s, whose layer inputs the checkpoint quantises, is not the B operand of a MatMul: strata cannot apply its activation quantisation", fn.GetName(), input)
		}
	}
	fn.Node = nodes
	if !slices.ContainsFunc(fn.GetOpsetImport(), func(o *onnxpb.OperatorSetIdProto) bool { return o.GetDomain() == blocks.QuantDomain }) {
		fn.OpsetImport = append(fn.OpsetImport, &onnxpb.OperatorSetIdProto{Domain: blocks.QuantDomain, Version: 1})
	}
	return nil
}

// call rewrites a local function n calls for the weights n passes it, once:
// a second call passing weights to other inputs is refused.
func (r *actRewrite) call(n *onnxpb.NodeProto, callee *onnxpb.FunctionProto, derived, schemes map[string]string) error {
	inner := map[string]string{}
	for i, in := range n.GetInput() {
		if w := derived[in]; w != "" && i < len(callee.GetInput()) {
			inner[callee.GetInput()[i]] = schemes[w]
		}
	}
	key := fmt.Sprint(inner)
	name := callee.GetDomain() + "::" + callee.GetName()
	if prev, done := r.done[name]; done {
		if prev != key {
			return fmt.Errorf("%s is called with quantised weights on different inputs (%s, %s): strata rewrites a function once", name, prev, key)
		}
		return nil
	}
	r.done[name] = key
	return r.function(callee, inner)
}

// carried reports whether one of n's inputs carries a weight input, and which.
func carried(n *onnxpb.NodeProto, derived map[string]string) (string, bool) {
	for _, in := range n.GetInput() {
		if w, ok := derived[in]; ok {
			return w, true
		}
	}
	return "", false
}

// activationSchemes maps each formal input of resp's function to the
// activation quantisation of the weights bound to it, which must be the
// same in every layer the function serves.
func activationSchemes(resp *pb.BuildResponse, q *quant.View) (map[string]string, error) {
	out := map[string]string{}
	if !q.QuantizesActivations() { // no binding to read (Kimi-K2's were 4% of its export)
		return out, nil
	}
	seen := map[string]bool{}
	for _, lw := range resp.GetWeights() {
		for _, wb := range lw.GetBindings() {
			e, err := weights.BindingExpr(wb, nil)
			if err != nil {
				return nil, err
			}
			scheme, mixed := "", false
			for i, k := range e.Keys() {
				s := q.Activation(k)
				if i > 0 && s != scheme {
					mixed = true
				}
				scheme = s
			}
			input := wb.GetInput()
			if mixed || seen[input] && out[input] != scheme {
				return nil, fmt.Errorf("%s: input %s binds weights whose layer inputs are quantised differently (layer %s): strata computes one activation quantisation per function input",
					resp.GetFunction().GetName(), input, layerName(lw.GetLayer()))
			}
			seen[input] = true
			if scheme != "" {
				out[input] = scheme
			}
		}
	}
	return out, nil
}

func layerName(l int32) string {
	if l == sdk.NonLayer {
		return "none"
	}
	return fmt.Sprint(l)
}
