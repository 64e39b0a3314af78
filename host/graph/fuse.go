package graph

import (
	"slices"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// msDomain is ONNX Runtime's contrib op domain.
const msDomain = "com.microsoft"

// FuseResidualNorms fuses, across the parts of an inlined graph, each Add
// producing one of sums (the hidden states passed from a layer to the
// next part: a residual x + branch, both [B,S,H]) with the
// SimplifiedLayerNormalization the next part opens with, into one
// com.microsoft SkipSimplifiedLayerNormalization: its output 0 is the
// norm's, its output 3 the Add's, so every other reader of the sum reads
// it unchanged. A part cannot fuse its last add with the next part's norm
// itself (ONNX Runtime's form, --target ort). The fused node takes the
// norm's place: its weight may be computed just before it (a cast of a
// bf16 weight); an Add read between the two stays as it is. It returns
// how many were fused, or an error when the graph imports
// com.microsoft at another version.
func (b *Builder) FuseResidualNorms(sums map[string]bool) (int, error) {
	nodes := b.graph.GetNode()
	adds := map[string]int{} // sum -> index of its Add
	readers := map[string]int{}
	for i, n := range nodes {
		if n.GetOpType() == "Add" && n.GetDomain() == "" && len(n.GetOutput()) == 1 && sums[n.GetOutput()[0]] {
			adds[n.GetOutput()[0]] = i
		}
	}
	drop := map[int]bool{}
	for i, n := range nodes {
		for _, in := range n.GetInput() {
			if _, ok := adds[in]; ok {
				readers[in]++
			}
		}
		if !fusableNorm(n) {
			continue
		}
		sum := n.GetInput()[0]
		a, ok := adds[sum]
		// Only the first norm of the sum, and only when nothing read the
		// sum between the Add and it (it is then computed here).
		if !ok || drop[a] || readers[sum] != 1 {
			continue
		}
		add := nodes[a]
		nodes[i] = &onnxpb.NodeProto{Name: n.GetName(), OpType: "SkipSimplifiedLayerNormalization", Domain: msDomain,
			Input:     []string{add.GetInput()[0], add.GetInput()[1], n.GetInput()[1]},
			Output:    []string{n.GetOutput()[0], "", "", sum},
			Attribute: epsilonOf(n)}
		drop[a] = true
	}
	if len(drop) == 0 {
		return 0, nil
	}
	kept := nodes[:0]
	for i, n := range nodes {
		if !drop[i] {
			kept = append(kept, n)
		}
	}
	b.graph.Node = slices.Clip(kept)
	return len(drop), b.Import(msDomain, 1)
}

// fusableNorm: a SimplifiedLayerNormalization over the last axis with
// float32 statistics (as SkipSimplifiedLayerNormalization computes them),
// of an input and a weight, with its output alone.
func fusableNorm(n *onnxpb.NodeProto) bool {
	if n.GetOpType() != "SimplifiedLayerNormalization" || (n.GetDomain() != "" && n.GetDomain() != "ai.onnx") ||
		len(n.GetInput()) != 2 || len(n.GetOutput()) != 1 {
		return false
	}
	for _, a := range n.GetAttribute() {
		switch a.GetName() {
		case "axis":
			if a.GetI() != -1 {
				return false
			}
		case "stash_type":
			if a.GetI() != 1 {
				return false
			}
		case "epsilon":
		default:
			return false
		}
	}
	return true
}

// epsilonOf is the norm's epsilon as an attribute, its default (1e-5)
// spelled out: SkipSimplifiedLayerNormalization's default is 1e-12.
func epsilonOf(n *onnxpb.NodeProto) []*onnxpb.AttributeProto {
	for _, a := range n.GetAttribute() {
		if a.GetName() == "epsilon" {
			return []*onnxpb.AttributeProto{a}
		}
	}
	return []*onnxpb.AttributeProto{{Name: "epsilon", Type: onnxpb.AttributeProto_FLOAT, F: 1e-5}}
}
