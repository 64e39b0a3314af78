package blocks_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/refeval"
	"github.com/strata-llm/strata/sdk/weight"
)

// End-to-end: the SDK's blocks run through the evaluator and are compared
// with the same math written as plain loops in float64.

func randoms(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func run(t *testing.T, f *fn.Func, in map[string]refeval.Tensor) map[string]refeval.Tensor {
	t.Helper()
	out, err := refeval.Run(f.Proto(), f.Dependencies(), in)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func closeTo(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	worst := 0.0
	for i := range got {
		d := math.Abs(float64(got[i])-want[i]) / math.Max(1, math.Abs(want[i]))
		if !(d <= tol) {
			t.Errorf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
		worst = math.Max(worst, d)
	}
	t.Logf("%s: max error %.2g", what, worst)
}

func rmsNorm(x []float64, w []float32, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(w[i]) * v * r
	}
	return out
}

func TestRMSNormBlock(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x, w := randoms(r, 2*3*8), randoms(r, 8)
	f := fn.NewFunc("test", "Norm", fn.Float32)
	f.Output("y", blocks.RMSNorm(f, f.Input("x"), f.Input("w"), 1e-5))
	got := run(t, f, map[string]refeval.Tensor{"x": refeval.Floats([]int64{2, 3, 8}, x...), "w": refeval.Floats([]int64{8}, w...)})["y"]
	var want []float64
	for row := range 6 {
		xs := make([]float64, 8)
		for i := range xs {
			xs[i] = float64(x[row*8+i])
		}
		want = append(want, rmsNorm(xs, w, 1e-5)...)
	}
	closeTo(t, "rmsnorm", got.F, want, 1e-6)
}

// linear is x [n,in] · W[out,in]ᵀ + b.
func linear(x []float64, n int, w []float32, out int, b []float32) []float64 {
	in := len(x) / n
	y := make([]float64, n*out)
	for t := range n {
		for o := range out {
			var s float64
			for i := range in {
				s += x[t*in+i] * float64(w[o*in+i])
			}
			if b != nil {
				s += float64(b[o])
			}
			y[t*out+o] = s
		}
	}
	return y
}

func f64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// TestAttentionBlock: GQA attention with Qwen3-style q/k norms (per head;
// or OLMo-2's, over all heads before the split), a biased q projection and RoPE over the retained KV cache, against loops: prefill
// (a padding query at position -1 in row 1), decode over a cache whose
// slots past each row's position hold garbage that must not be read, and
// continuous batching (rows scattered into cache rows by batch_index).
func TestAttentionBlock(t *testing.T) {
	const (
		C, H        = 5, 8
		nH, nKV, hd = 4, 2, 4
		eps         = 1e-6
	)
	cases := []struct {
		name       string
		S          int
		pos        []int64 // [B,S]
		rows       int     // cache rows
		batchIndex []int64 // cache row of each batch row, or nil
		sinks      bool    // a per-head sink logit in the softmax (gpt-oss)
		window     int     // sliding window (0: full attention)
		allHeads   bool    // q/k norms over all heads (OLMo-2), not per head
		softCap    float64 // scores soft-capped before the mask (Gemma-2), or 0
	}{
		{"prefill with padding", 3, []int64{0, 1, 2, 0, 1, -1}, 2, nil, false, 0, false, 0},
		{"decode over a filled cache", 1, []int64{3, 1}, 2, nil, false, 0, false, 0},
		{"continuous batching", 2, []int64{2, 3, 0, 1}, 3, []int64{2, 0}, false, 0, false, 0},
		{"prefill with sinks and a window of 2", 3, []int64{0, 1, 2, 0, 1, -1}, 2, nil, true, 2, false, 0},
		{"decode with sinks past a window of 2", 1, []int64{4, 2}, 2, nil, true, 2, false, 0},
		{"prefill with q/k norms over all heads", 3, []int64{0, 1, 2, 0, 1, -1}, 2, nil, false, 0, true, 0},
		{"decode with q/k norms over all heads", 1, []int64{3, 1}, 2, nil, false, 0, true, 0},
		{"prefill with a soft-cap of 0.5", 3, []int64{0, 1, 2, 0, 1, -1}, 2, nil, false, 0, false, 0.5},
		{"decode with a soft-cap, sinks and a window of 2", 1, []int64{4, 2}, 2, nil, true, 2, false, 0.5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			B, S := len(tc.pos)/tc.S, tc.S
			r := rand.New(rand.NewPCG(3, 4))
			x := randoms(r, B*S*H)
			wq, wk, wv, wo := randoms(r, nH*hd*H), randoms(r, nKV*hd*H), randoms(r, nKV*hd*H), randoms(r, H*nH*hd)
			bq := randoms(r, nH*hd)
			qn, kn := randoms(r, hd), randoms(r, hd)
			qnShape, knShape := []int64{hd}, []int64{hd}
			if tc.allHeads {
				qn, kn = randoms(r, nH*hd), randoms(r, nKV*hd)
				qnShape, knShape = []int64{nH * hd}, []int64{nKV * hd}
			}
			pastK, pastV := randoms(r, tc.rows*nKV*C*hd), randoms(r, tc.rows*nKV*C*hd)
			sinks := randoms(r, nH)
			rope := blocks.RoPE{Type: "default", Base: 10000, Dim: hd, AttentionScaling: 1}

			f := fn.NewFunc("test", "Attn", fn.Float32)
			xin, pin := f.Input("x"), f.Input("position_ids")
			c := blocks.AttentionContext{PositionIDs: pin, PastKey: f.Input("past_key"), PastValue: f.Input("past_value")}
			in := map[string]refeval.Tensor{}
			if tc.batchIndex != nil {
				c.BatchIndex = f.Input("batch_index")
				in["batch_index"] = refeval.Ints([]int64{int64(B), 1}, tc.batchIndex...)
			}
			a := blocks.Attention{Heads: nH, KVHeads: nKV, HeadDim: hd, RoPE: rope, NormEps: eps,
				Q: blocks.LinearInputs(f, "q", true), K: blocks.LinearInputs(f, "k", false),
				V: blocks.LinearInputs(f, "v", false), O: blocks.LinearInputs(f, "o", false),
				QNorm: f.Input("q_norm"), KNorm: f.Input("k_norm"), NormAllHeads: tc.allHeads, SoftCap: tc.softCap}
			if tc.sinks {
				a.Sinks = f.Input("sinks")
				in["sinks"] = refeval.Floats([]int64{nH}, sinks...)
			}
			slots := blocks.CacheSlots(f, c.PastKey, "")
			c.Mask = blocks.CausalMask(f, pin, slots)
			if tc.window > 0 {
				c.Mask = blocks.SlidingWindowMask(f, pin, slots, tc.window)
			}
			c.ReadIndices, c.Invalid = blocks.CacheReadIndices(f, pin, slots)
			c.Cos, c.Sin = rope.Tables(f, pin)
			out, pk, pv := a.Apply(f, xin, c)
			f.Output("out", out)
			f.Output("present_key", pk)
			f.Output("present_value", pv)

			cacheShape := []int64{int64(tc.rows), nKV, C, hd}
			for k, v := range map[string]refeval.Tensor{
				"x": refeval.Floats([]int64{int64(B), int64(S), H}, x...), "position_ids": refeval.Ints([]int64{int64(B), int64(S)}, tc.pos...),
				"past_key": refeval.Floats(cacheShape, pastK...), "past_value": refeval.Floats(cacheShape, pastV...),
				"q.weight": refeval.Floats([]int64{nH * hd, H}, wq...), "q.bias": refeval.Floats([]int64{nH * hd}, bq...),
				"k.weight": refeval.Floats([]int64{nKV * hd, H}, wk...), "v.weight": refeval.Floats([]int64{nKV * hd, H}, wv...),
				"o.weight": refeval.Floats([]int64{H, nH * hd}, wo...),
				"q_norm":   refeval.Floats(qnShape, qn...), "k_norm": refeval.Floats(knShape, kn...),
			} {
				in[k] = v
			}
			res := run(t, f, in)

			// The same in loops: the expected caches start as the past ones
			// and receive this step's keys and values at their positions.
			q := linear(f64(x), B*S, wq, nH*hd, bq)
			k := linear(f64(x), B*S, wk, nKV*hd, nil)
			v := linear(f64(x), B*S, wv, nKV*hd, nil)
			if tc.allHeads { // each token's q (and k) normed as one vector; no per-head norm
				for tok := range B * S {
					copy(q[tok*nH*hd:], rmsNorm(q[tok*nH*hd:(tok+1)*nH*hd], qn, eps))
					copy(k[tok*nKV*hd:], rmsNorm(k[tok*nKV*hd:(tok+1)*nKV*hd], kn, eps))
				}
			}
			normRope := func(vec []float64, w []float32, p int64) []float64 {
				y := vec
				if !tc.allHeads {
					y = rmsNorm(vec, w, eps)
				}
				out := make([]float64, hd)
				for i := range hd / 2 {
					ang := float64(p) * math.Pow(10000, -float64(2*i)/hd)
					c, s := math.Cos(ang), math.Sin(ang)
					out[i] = y[i]*c - y[i+hd/2]*s
					out[i+hd/2] = y[i+hd/2]*c + y[i]*s
				}
				return out
			}
			wantK, wantV := f64(pastK), f64(pastV)
			at := func(row, g int, slot int64) int { return ((row*nKV+g)*C + int(slot)) * hd }
			cacheRow := func(b int) int {
				if tc.batchIndex != nil {
					return int(tc.batchIndex[b])
				}
				return b
			}
			for b := range B {
				for s := range S {
					p := tc.pos[b*S+s]
					if p < 0 {
						continue // padding writes the last slot, checked below
					}
					for g := range nKV {
						off := (b*S+s)*nKV*hd + g*hd
						copy(wantK[at(cacheRow(b), g, p):], normRope(k[off:off+hd], kn, p))
						copy(wantV[at(cacheRow(b), g, p):], v[off:off+hd])
					}
				}
			}
			var want []float64
			var got []float32
			bites := false // some score beyond the soft-cap, so that it shows
			for b := range B {
				row := cacheRow(b)
				for s := range S {
					p := tc.pos[b*S+s]
					if p < 0 {
						continue // a padding query's output is unspecified
					}
					ctx := make([]float64, nH*hd)
					for h := range nH {
						g := h / (nH / nKV)
						qh := normRope(q[(b*S+s)*nH*hd+h*hd:(b*S+s)*nH*hd+(h+1)*hd], qn, p)
						var scores []float64
						m := math.Inf(-1)
						first := int64(0)
						if tc.window > 0 {
							first = max(0, p-int64(tc.window)+1)
						}
						for j := first; j <= p; j++ {
							var dot float64
							for i := range hd {
								dot += qh[i] * wantK[at(row, g, j)+i]
							}
							score := dot / math.Sqrt(hd)
							bites = bites || math.Abs(score) > tc.softCap
							if tc.softCap != 0 {
								score = tc.softCap * math.Tanh(score/tc.softCap)
							}
							scores = append(scores, score)
							m = math.Max(m, score)
						}
						var z float64
						if tc.sinks {
							m = math.Max(m, float64(sinks[h]))
							z = math.Exp(float64(sinks[h]) - m)
						}
						for j := range scores {
							scores[j] = math.Exp(scores[j] - m)
							z += scores[j]
						}
						for j := range scores {
							for i := range hd {
								ctx[h*hd+i] += scores[j] / z * wantV[at(row, g, first+int64(j))+i]
							}
						}
					}
					want = append(want, linear(ctx, 1, wo, H, nil)...)
					got = append(got, res["out"].F[(b*S+s)*H:(b*S+s+1)*H]...)
				}
			}
			if tc.softCap != 0 && !bites {
				t.Fatalf("no score exceeds the soft-cap %g: the case does not test it", tc.softCap)
			}
			closeTo(t, "attention", got, want, 1e-5)
			// Caches: everything but a padding query's write (the last slot
			// of its row, which stays masked).
			var gotK, gotV []float32
			var expK, expV []float64
			for row := range tc.rows {
				for g := range nKV {
					for slot := range int64(C) {
						if strings.HasPrefix(tc.name, "prefill") && row == 1 && slot == C-1 {
							continue
						}
						o := at(row, g, slot)
						gotK, gotV = append(gotK, res["present_key"].F[o:o+hd]...), append(gotV, res["present_value"].F[o:o+hd]...)
						expK, expV = append(expK, wantK[o:o+hd]...), append(expV, wantV[o:o+hd]...)
					}
				}
			}
			closeTo(t, "present_key", gotK, expK, 1e-5)
			closeTo(t, "present_value", gotV, expV, 1e-6)
		})
	}
}

func TestRouterBlocks(t *testing.T) {
	const T, H, E, k = 3, 4, 6, 2
	r := rand.New(rand.NewPCG(5, 6))
	x, w, bias, corr := randoms(r, T*H), randoms(r, E*H), randoms(r, E), randoms(r, E)
	logits := linear(f64(x), T, w, E, nil)
	biased := linear(f64(x), T, w, E, bias)

	// topk returns the indices of the k largest of v, lower index first on ties.
	topk := func(v []float64, k int) []int {
		var idx []int
		used := make([]bool, len(v))
		for range k {
			best := -1
			for i := range v {
				if !used[i] && (best < 0 || v[i] > v[best]) {
					best = i
				}
			}
			used[best] = true
			idx = append(idx, best)
		}
		return idx
	}
	softmax := func(v []float64) []float64 {
		m := math.Inf(-1)
		for _, x := range v {
			m = math.Max(m, x)
		}
		var z float64
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = math.Exp(x - m)
			z += out[i]
		}
		for i := range out {
			out[i] /= z
		}
		return out
	}
	sigmoid := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

	cases := map[string]struct {
		router blocks.Router
		want   func(tok int) ([]float64, []int)
	}{
		"softmax_topk normalized": {blocks.Router{Kind: blocks.SoftmaxTopK, Experts: E, TopK: k, Normalize: true},
			func(tok int) ([]float64, []int) {
				p := softmax(logits[tok*E : (tok+1)*E])
				idx := topk(p, k)
				s := p[idx[0]] + p[idx[1]]
				return []float64{p[idx[0]] / s, p[idx[1]] / s}, idx
			}},
		"topk_softmax with bias (gpt-oss)": {blocks.Router{Kind: blocks.TopKSoftmax, Experts: E, TopK: k},
			func(tok int) ([]float64, []int) {
				l := biased[tok*E : (tok+1)*E]
				idx := topk(l, k)
				return softmax([]float64{l[idx[0]], l[idx[1]]}), idx
			}},
		"sigmoid_grouped (GLM)": {blocks.Router{Kind: blocks.SigmoidGrouped, Experts: E, TopK: k, Normalize: true, Groups: 3, TopKGroups: 2, Scale: 2.5},
			func(tok int) ([]float64, []int) {
				scores := make([]float64, E)
				choice := make([]float64, E)
				for e := range E {
					scores[e] = sigmoid(logits[tok*E+e])
					choice[e] = scores[e] + float64(corr[e])
				}
				groupScore := make([]float64, 3)
				for g := range 3 { // two experts per group: both are its top 2
					groupScore[g] = choice[2*g] + choice[2*g+1]
				}
				keep := topk(groupScore, 2)
				masked := make([]float64, E)
				for e := range masked {
					masked[e] = math.Inf(-1)
				}
				for _, g := range keep {
					masked[2*g], masked[2*g+1] = choice[2*g], choice[2*g+1]
				}
				idx := topk(masked, k)
				s := scores[idx[0]] + scores[idx[1]] + 1e-20
				return []float64{2.5 * scores[idx[0]] / s, 2.5 * scores[idx[1]] / s}, idx
			}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := fn.NewFunc("test", "Router", fn.Float32)
			xin := f.Input("x")
			rt := tc.router
			rt.Weight = f.Input("w")
			in := map[string]refeval.Tensor{"x": refeval.Floats([]int64{T, H}, x...), "w": refeval.Floats([]int64{E, H}, w...)}
			if rt.Kind == blocks.TopKSoftmax {
				rt.Bias = f.Input("b")
				in["b"] = refeval.Floats([]int64{E}, bias...)
			}
			if rt.Kind == blocks.SigmoidGrouped {
				rt.CorrectionBias = f.Input("corr")
				in["corr"] = refeval.Floats([]int64{E}, corr...)
			}
			weights, indices, err := rt.Route(f, xin)
			if err != nil {
				t.Fatal(err)
			}
			f.Output("weights", weights)
			f.Output("indices", indices)
			res := run(t, f, in)
			var wantW []float64
			for tok := range T {
				ww, wi := tc.want(tok)
				wantW = append(wantW, ww...)
				for j := range k {
					if got := res["indices"].I[tok*k+j]; got != int64(wi[j]) {
						t.Errorf("token %d choice %d: expert %d, want %d", tok, j, got, wi[j])
					}
				}
			}
			closeTo(t, "weights", res["weights"].F, wantW, 1e-6)
		})
	}
}

// The model-level parts: the context's mask and cache read indices, and
// the final part's last-valid-token pick, norm and head.
func TestContextAndFinalParts(t *testing.T) {
	rope := blocks.RoPE{Type: "default", Base: 10000, Dim: 4, AttentionScaling: 1}
	ctx := decoder.ContextPart("test", "Context", fn.Float32, rope, nil, nil)
	res, err := refeval.Run(ctx.GetFunction(), ctx.GetDependencies(), map[string]refeval.Tensor{
		"position_ids": refeval.Ints([]int64{2, 1}, 3, -1),
		"past_key":     refeval.Floats([]int64{2, 1, 5, 4}, make([]float32, 40)...),
	})
	if err != nil {
		t.Fatal(err)
	}
	wantMask := []bool{false, false, false, false, true, true, true, true, true, true}
	if !slices.Equal(res[decoder.CtxMask].B, wantMask) || !slices.Equal(res[decoder.CtxMask].Shape, []int64{2, 1, 1, 5}) {
		t.Errorf("mask %v %v, want %v", res[decoder.CtxMask].Shape, res[decoder.CtxMask].B, wantMask)
	}
	if want := []int64{0, 1, 2, 3, 0, 0, 0, 0, 0, 0}; !slices.Equal(res[decoder.CtxReadIndices].I, want) {
		t.Errorf("read indices %v, want %v", res[decoder.CtxReadIndices].I, want)
	}
	if want := []bool{false, false, false, false, true, true, true, true, true, true}; !slices.Equal(res[decoder.CtxReadInvalid].B, want) {
		t.Errorf("invalid %v, want %v", res[decoder.CtxReadInvalid].B, want)
	}
	if got := res[decoder.CtxCos]; !slices.Equal(got.Shape, []int64{2, 1, 1, 4}) || math.Abs(float64(got.F[0])-math.Cos(3)) > 1e-6 {
		t.Errorf("cos %v %v", got.Shape, got.F)
	}

	const B, S, H, V = 2, 3, 4, 5
	r := rand.New(rand.NewPCG(7, 8))
	hidden, norm, head := randoms(r, B*S*H), randoms(r, H), randoms(r, V*H)
	final := decoder.FinalPart("test", "Final", fn.Float32, 1e-5, weight.Tensor("model.norm.weight"), weight.Tensor("lm_head.weight"), false)
	res, err = refeval.Run(final.GetFunction(), final.GetDependencies(), map[string]refeval.Tensor{
		"hidden_states": refeval.Floats([]int64{B, S, H}, hidden...), "position_ids": refeval.Ints([]int64{B, S}, 0, 1, 2, 0, 1, -1),
		"norm.weight": refeval.Floats([]int64{H}, norm...), "lm_head.weight": refeval.Floats([]int64{V, H}, head...),
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []float64
	for _, tok := range []int{2, S + 1} { // each row's last valid token
		want = append(want, linear(rmsNorm(f64(hidden[tok*H:(tok+1)*H]), norm, 1e-5), 1, head, V, nil)...)
	}
	logits := res["logits"]
	if !slices.Equal(logits.Shape, []int64{B, 1, V}) {
		t.Errorf("logits shape %v", logits.Shape)
	}
	closeTo(t, "logits", logits.F, want, 1e-5)
}

// TestResidualNormPlacement: decoder.Layer.Residual with its norms before,
// after, or around each branch (Llama, OLMo-2, Gemma-2; Gemma-3's with
// every norm weighing by 1 + w and a tanh-GELU gated MLP), and OLMo-2's q/k
// norms over all heads, built as a plugin builds the layer, against the
// layer written out: RMSNorms, residual adds and the MLP as loops; the
// attention as blocks.Attention alone (TestAttentionBlock checks it
// against loops) on the branch's input the loops computed.
func TestResidualNormPlacement(t *testing.T) {
	const (
		B, S, C, H, I = 2, 3, 4, 8, 6
		nH, nKV, hd   = 2, 1, 4
		eps           = 1e-5
	)
	config := []byte(`{"model_type": "toy", "hidden_size": 8, "intermediate_size": 6, "num_hidden_layers": 1,
		"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000}`)
	rope := blocks.RoPE{Type: "default", Base: 10000, Dim: hd, AttentionScaling: 1}
	both := []decoder.Norms{{Pre: "input_layernorm", Post: "post_attention_layernorm"}, {Pre: "pre_feedforward_layernorm", Post: "post_feedforward_layernorm"}}
	cases := map[string]struct {
		attn, mlp decoder.Norms
		onePlus   bool // decoder.Model.NormOnePlus
		act       blocks.Activation
	}{
		"pre (Llama)":                  {attn: decoder.Norms{Pre: "input_layernorm"}, mlp: decoder.Norms{Pre: "post_attention_layernorm"}},
		"post (OLMo-2)":                {attn: decoder.Norms{Post: "post_attention_layernorm"}, mlp: decoder.Norms{Post: "post_feedforward_layernorm"}},
		"both (Gemma-2)":               {attn: both[0], mlp: both[1]},
		"both, 1 + w, GeGLU (Gemma-3)": {attn: both[0], mlp: both[1], onePlus: true, act: blocks.ActGELUTanh},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			plugin := decoder.Plugin{Name: "toy", Version: "1", Architectures: []decoder.Architecture{{ModelType: "toy", Name: "Toy",
				Load: func(m *decoder.Model) error {
					m.NormOnePlus = tc.onePlus
					m.Kind("decoder", "ToyLayer", func(l *decoder.Layer) error {
						return l.Residual(&decoder.Attention{QKNorm: true, QKNormAllHeads: true}, tc.attn,
							&decoder.SwiGLU{Width: m.Intermediate, Act: tc.act}, tc.mlp)
					})
					return nil
				}}}}
			model := plugintest.Model(t, plugin, config, "F32")
			layer, err := plugin.Build(context.Background(), &pb.BuildRequest{Model: model, Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0}})
			if err != nil {
				t.Fatal(err)
			}

			r := rand.New(rand.NewPCG(9, 10))
			pos := refeval.Ints([]int64{B, S}, 0, 1, 2, 0, 1, -1)
			cacheShape := []int64{B, nKV, C, hd}
			in := map[string]refeval.Tensor{
				sdk.HiddenStates: refeval.Floats([]int64{B, S, H}, randoms(r, B*S*H)...), sdk.PositionIDs: pos,
				decoder.PastKey: refeval.Floats(cacheShape, randoms(r, B*nKV*C*hd)...), decoder.PastValue: refeval.Floats(cacheShape, randoms(r, B*nKV*C*hd)...),
			}
			ctx := decoder.ContextPart("test", "Context", fn.Float32, rope, nil, nil)
			ctxOut, err := refeval.Run(ctx.GetFunction(), ctx.GetDependencies(), map[string]refeval.Tensor{sdk.PositionIDs: pos, decoder.PastKey: in[decoder.PastKey]})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range decoder.StandardContext {
				in[c] = ctxOut[c]
			}
			weights := map[string][]float32{}
			want, err := plugin.ExpectedTensors(model)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range want {
				name, ok := strings.CutPrefix(w.Key, "model.layers.0.")
				if !ok {
					continue
				}
				n := int64(1)
				for _, d := range w.Shape {
					n *= d
				}
				weights[name] = randoms(r, int(n))
				in[name] = refeval.Floats(w.Shape, weights[name]...)
			}
			res, err := refeval.Run(layer.GetFunction(), layer.GetDependencies(), in)
			if err != nil {
				t.Fatal(err)
			}

			// The layer written out, row by row ([B*S] tokens of [H]).
			norm := func(x []float64, name string) []float64 {
				if name == "" {
					return x
				}
				out := make([]float64, 0, len(x))
				w := weights[name+".weight"]
				if tc.onePlus {
					w = onePlus(w)
				}
				for tok := range len(x) / H {
					out = append(out, rmsNorm(x[tok*H:(tok+1)*H], w, eps)...)
				}
				return out
			}
			add := func(a, b []float64) []float64 {
				out := make([]float64, len(a))
				for i := range a {
					out[i] = a[i] + b[i]
				}
				return out
			}
			x := f64(in[sdk.HiddenStates].F)
			branchIn := norm(x, tc.attn.Pre)

			f := fn.NewFunc("test", "Attn", fn.Float32)
			c := blocks.AttentionContext{PositionIDs: f.Input(sdk.PositionIDs), PastKey: f.Input(decoder.PastKey), PastValue: f.Input(decoder.PastValue),
				Cos: f.Input(decoder.CtxCos), Sin: f.Input(decoder.CtxSin), Mask: f.Input(decoder.CtxMask),
				ReadIndices: f.Input(decoder.CtxReadIndices), Invalid: f.Input(decoder.CtxReadInvalid)}
			a := blocks.Attention{Heads: nH, KVHeads: nKV, HeadDim: hd, RoPE: rope, NormEps: eps, NormAllHeads: true, NormOnePlus: tc.onePlus,
				Q: blocks.LinearInputs(f, "self_attn.q_proj", false), K: blocks.LinearInputs(f, "self_attn.k_proj", false),
				V: blocks.LinearInputs(f, "self_attn.v_proj", false), O: blocks.LinearInputs(f, "self_attn.o_proj", false),
				QNorm: f.Input("self_attn.q_norm.weight"), KNorm: f.Input("self_attn.k_norm.weight")}
			attnOut, presentKey, _ := a.Apply(f, f.Input("x"), c)
			f.Output("out", attnOut)
			f.Output("present_key", presentKey)
			attnIn32 := make([]float32, len(branchIn))
			for i, v := range branchIn {
				attnIn32[i] = float32(v)
			}
			in["x"] = refeval.Floats([]int64{B, S, H}, attnIn32...)
			attnIn := map[string]refeval.Tensor{}
			for _, name := range f.Proto().GetInput() {
				attnIn[name] = in[name]
			}
			attn := run(t, f, attnIn)

			h := add(x, norm(f64(attn["out"].F), tc.attn.Post))
			m := norm(h, tc.mlp.Pre)
			gate := linear(m, B*S, weights["mlp.gate_proj.weight"], I, nil)
			up := linear(m, B*S, weights["mlp.up_proj.weight"], I, nil)
			for i := range gate {
				if tc.act == blocks.ActGELUTanh {
					gate[i] = geluTanh(gate[i]) * up[i]
				} else {
					gate[i] = gate[i] / (1 + math.Exp(-gate[i])) * up[i]
				}
			}
			wantOut := add(h, norm(linear(gate, B*S, weights["mlp.down_proj.weight"], H, nil), tc.mlp.Post))
			closeTo(t, "layer output", res[sdk.HiddenStatesOut].F, wantOut, 1e-5)
			closeTo(t, "present_key", res[decoder.PastKey+sdk.RetainedSuffix].F, f64(attn["present_key"].F), 1e-6)
			for _, n := range []string{tc.attn.Pre, tc.attn.Post, tc.mlp.Pre, tc.mlp.Post} {
				if _, ok := weights[n+".weight"]; n != "" && !ok {
					t.Errorf("the layer declares no %s.weight", n)
				}
			}
		})
	}
}
