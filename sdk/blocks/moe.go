package blocks

import (
	"github.com/strata-llm/strata/sdk/fn"

	"fmt"
	"math"
)

// Mixture-of-experts blocks: routers that pick each token's experts and
// their weights, and two ways to run the experts. Tokens are flattened:
// x is [T, H].

// Router kinds.
const (
	// SoftmaxTopK: softmax over all experts in float32, top-k, optionally
	// renormalised to sum 1 (Qwen3-MoE, Qwen3-VL-MoE, Mixtral).
	SoftmaxTopK = "softmax_topk"
	// TopKSoftmax: top-k of the logits, softmax over the k (gpt-oss).
	TopKSoftmax = "topk_softmax"
	// SigmoidGrouped: sigmoid scores in float32; experts chosen by score +
	// correction bias within the best groups; weights are the scores, maybe
	// renormalised, times a scaling factor (GLM-4.5, DeepSeek-V3 noaux_tc).
	SigmoidGrouped = "sigmoid_grouped"
)

// Router picks each token's top-k experts.
type Router struct {
	Kind      string
	Experts   int
	TopK      int
	Normalize bool     // renormalise the chosen weights to sum 1
	Weight    fn.Value // [E, H]
	Bias      fn.Value // [E] logit bias (gpt-oss), or ""
	// SigmoidGrouped only.
	CorrectionBias fn.Value // [E] e_score_correction_bias (selection only)
	Groups         int      // n_group
	TopKGroups     int      // topk_group
	Scale          float64
}

// Route returns each token's expert weights [T, k] (compute dtype) and
// expert indices [T, k] int64.
func (r Router) Route(f *fn.Func, x fn.Value) (weights, indices fn.Value, err error) {
	switch r.Kind {
	case SoftmaxTopK:
		weights, indices = r.softmaxTopK(f, x)
	case TopKSoftmax:
		weights, indices = r.topKSoftmax(f, x)
	case SigmoidGrouped:
		if r.Groups < 1 || r.Experts%r.Groups != 0 || r.TopKGroups < 1 || r.TopKGroups > r.Groups {
			return "", "", fmt.Errorf("router: %d experts in %d groups, keeping %d: groups must divide the experts", r.Experts, r.Groups, r.TopKGroups)
		}
		weights, indices = r.sigmoidGrouped(f, x)
	default:
		return "", "", fmt.Errorf("unknown router kind %q", r.Kind)
	}
	return weights, indices, nil
}

func (r Router) logits(f *fn.Func, x fn.Value) fn.Value {
	return Linear{Weight: r.Weight, Bias: r.Bias}.Apply(f, x)
}

func (r Router) softmaxTopK(f *fn.Func, x fn.Value) (fn.Value, fn.Value) {
	probs := f.Softmax(f.CastTo(r.logits(f, x), f.DType(), fn.Float32), -1)
	w, idx := f.TopK(probs, r.TopK)
	if r.Normalize {
		w = f.Div(w, f.ReduceSum(w, true, -1))
	}
	return f.CastTo(w, fn.Float32, f.DType()), idx
}

func (r Router) topKSoftmax(f *fn.Func, x fn.Value) (fn.Value, fn.Value) {
	v, idx := f.TopK(r.logits(f, x), r.TopK)
	return f.Softmax(v, -1), idx
}

// sigmoidGrouped follows transformers' Glm4MoeTopkRouter: groups scored by
// their two best biased scores, the best TopKGroups groups kept, the top-k
// experts among them, weighted by their unbiased scores.
func (r Router) sigmoidGrouped(f *fn.Func, x fn.Value) (fn.Value, fn.Value) {
	x32 := f.CastTo(x, f.DType(), fn.Float32)
	w32 := f.CastTo(r.Weight, f.DType(), fn.Float32)
	scores := f.Sigmoid(f.MatMul(x32, f.Transpose(w32, 1, 0))) // [T,E]
	// The correction bias arrives in the compute dtype.
	choice := f.Add(scores, f.CastTo(r.CorrectionBias, f.DType(), fn.Float32))
	perGroup := int64(r.Experts / r.Groups)
	grouped := f.Reshape(choice, 0, int64(r.Groups), perGroup) // [T,G,E/G]
	best2, _ := f.TopK(grouped, 2)
	groupScores := f.ReduceSum(best2, false, -1) // [T,G]
	_, keep := f.TopK(groupScores, r.TopKGroups)
	kept := f.Op("ScatterElements", []fn.Value{f.ZerosLike(groupScores), keep, f.OnesLike(keep, fn.Float32)}, fn.AttrInt("axis", 1))
	masked := f.Where(f.Greater(f.Unsqueeze(kept, -1), f.ScalarOf(fn.Float32, 0)), grouped, f.ScalarOf(fn.Float32, float32(math.Inf(-1))))
	_, idx := f.TopK(f.Reshape(masked, 0, int64(r.Experts)), r.TopK)
	w := f.Op("GatherElements", []fn.Value{scores, idx}, fn.AttrInt("axis", 1))
	if r.Normalize {
		w = f.Div(w, f.Add(f.ReduceSum(w, true, -1), f.ScalarOf(fn.Float32, 1e-20)))
	}
	if r.Scale != 0 && r.Scale != 1 {
		w = f.Mul(w, f.ScalarOf(fn.Float32, float32(r.Scale)))
	}
	return f.CastTo(w, fn.Float32, f.DType()), idx
}

// Expert strategies.
const (
	// Gather runs, per token, only its k experts, gathering their weights:
	// the reference toolchain's graph; cheap for decode.
	Gather = "gather"
	// Dense runs every expert on every token and weighs the results by the
	// routing weights (zero for experts not chosen): weights stay static
	// matmul operands, suits prefill and weight compression.
	Dense = "dense"
	// Fused runs router and experts as ONNX Runtime's com.microsoft MoE op
	// (ORTMoE; --target ort): each token's experts read in place, no
	// weights gathered. Softmax top-k routers and SwiGLU experts without
	// biases only (Qwen3-MoE's); a block without that form refuses it.
	Fused = "fused"
)

// ExpertStrategies lists the strategies every block takes (Fused is the
// few blocks' own: decoder.FusedMoEStrategyOption).
var ExpertStrategies = []string{Gather, Dense}

// Experts are E gated MLPs, weights stacked as the second matmul operand:
// Gate and Up [E, H, I], Down [E, I, H], optional biases [E, I] / [E, H].
type Experts struct {
	Gate, Up, Down             fn.Value
	GateBias, UpBias, DownBias fn.Value
	// Activation combines gate and up; nil is SwiGLU (silu(gate) * up).
	Activation func(f *fn.Func, gate, up fn.Value) fn.Value
}

func (e Experts) act(f *fn.Func, gate, up fn.Value) fn.Value {
	if e.Activation != nil {
		return e.Activation(f, gate, up)
	}
	return f.Mul(SiLU(f, gate), up)
}

// Apply runs the experts on x [T, H] with routing weights and indices
// [T, k], by strategy, and returns [T, H].
func (e Experts) Apply(f *fn.Func, strategy string, x, weights, indices fn.Value, numExperts int) (fn.Value, error) {
	switch strategy {
	case Gather:
		return e.gather(f, x, weights, indices), nil
	case Dense:
		return e.dense(f, x, weights, indices, numExperts), nil
	case Fused:
		return "", fmt.Errorf("expert strategy %s is ONNX Runtime's MoE op, which takes softmax top-k routed SwiGLU experts without biases (Qwen3-MoE's) with --target ort; these experts have no such form: use %s or %s", Fused, Gather, Dense)
	default:
		return "", fmt.Errorf("unknown expert strategy %q (use %s, %s or %s)", strategy, Gather, Dense, Fused)
	}
}

// gather: per token t and choice j, y[t,j] = expert_{idx[t,j]}(x[t]), then
// Σ_j w[t,j]·y[t,j].
func (e Experts) gather(f *fn.Func, x, weights, indices fn.Value) fn.Value {
	pick := func(w fn.Value) fn.Value { return f.Gather(w, indices, 0) } // [T,k,...]
	addBias := func(y, b fn.Value) fn.Value {
		if b == "" {
			return y
		}
		return f.Add(y, f.Unsqueeze(pick(b), 2))
	}
	xt := f.Unsqueeze(x, 1, 2) // [T,1,1,H]
	gate := addBias(f.MatMul(xt, pick(e.Gate)), e.GateBias)
	up := addBias(f.MatMul(xt, pick(e.Up)), e.UpBias)
	y := addBias(f.MatMul(e.act(f, gate, up), pick(e.Down)), e.DownBias) // [T,k,1,H]
	y = f.Op("Squeeze", []fn.Value{y, f.Ints(2)})                        // [T,k,H]
	return f.ReduceSum(f.Mul(y, f.Unsqueeze(weights, -1)), false, 1)
}

// dense: y[e,t] = expert_e(x[t]) for every expert, then Σ_e w[t,e]·y[e,t]
// with w zero for experts not chosen.
func (e Experts) dense(f *fn.Func, x, weights, indices fn.Value, numExperts int) fn.Value {
	addBias := func(y, b fn.Value) fn.Value {
		if b == "" {
			return y
		}
		return f.Add(y, f.Unsqueeze(b, 1))
	}
	xe := f.Unsqueeze(x, 0) // [1,T,H]
	gate := addBias(f.MatMul(xe, e.Gate), e.GateBias)
	up := addBias(f.MatMul(xe, e.Up), e.UpBias)
	y := addBias(f.MatMul(e.act(f, gate, up), e.Down), e.DownBias) // [E,T,H]
	tokens := f.Dim(x, 0)
	zeros := f.Op("ConstantOfShape", []fn.Value{f.Concat(0, f.Unsqueeze(tokens, 0), f.Ints(int64(numExperts)))},
		fn.AttrTensor("value", fn.MustFloatTensor(f.DType(), 0)))
	all := f.Op("ScatterElements", []fn.Value{zeros, indices, weights}, fn.AttrInt("axis", 1)) // [T,E]
	perExpert := f.Unsqueeze(f.Transpose(all, 1, 0), -1)                                       // [E,T,1]
	return f.ReduceSum(f.Mul(y, perExpert), false, 0)
}
