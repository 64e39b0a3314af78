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
// operand, and ships the quantising function as a dependency.
func quantizeActivations(resp *pb.BuildResponse, q *quant.View) error {
	schemes, err := activationSchemes(resp, q)
	if err != nil || len(schemes) == 0 {
		return err
	}
	fn := resp.GetFunction()
	quantizer := blocks.FP8DynamicPerTokenFunc()
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
		switch {
		case !carries:
		case (n.GetOpType() == "MatMul" || n.GetOpType() == "Gemm") && n.GetDomain() == "" && derived[n.Input[0]] == "":
			x := n.Input[0]
			if _, done := quantized[x]; !done {
				call := &onnxpb.NodeProto{Name: "actquant/" + x, OpType: quantizer.GetName(), Domain: quantizer.GetDomain(),
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
	resp.Dependencies = append(resp.Dependencies, quantizer)
	return nil
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
	seen := map[string]bool{}
	for _, lw := range resp.GetWeights() {
		for _, wb := range lw.GetBindings() {
			e, err := weights.BindingExpr(wb, nil)
			if err != nil {
				return nil, err
			}
			scheme, mixed := "", false
			for i, k := range e.Keys() {
				s := ""
				if w, ok := q.Weight(k); ok {
					s = w.Activation
				}
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
