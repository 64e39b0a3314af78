package decoder

import (
	"fmt"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/weight"
)

// Layer is a layer kind's function while its body builds it: the function
// (embedded: l.MatMul, l.Scope, ...), the standard inputs, and the weights
// declared so far.
type Layer struct {
	*fn.Func
	Model *Model
	Kind  *Kind
	// Hidden is the layer's input hidden state [B,S,H]; Attn what its
	// attention reads of the model level (positions, cache, context).
	Hidden fn.Value
	Attn   blocks.AttentionContext
	// States are the kind's caches other than the KV cache, by name
	// (conv_state, recurrent_state), for kinds without past_key.
	States map[string]fn.Value

	declared []declaredWeight
	finished bool
}

type declaredWeight struct {
	input string
	bind  func(layer int32) weight.Expr
}

func newLayer(m *Model, k *Kind, f *fn.Func) *Layer {
	l := &Layer{Func: f, Model: m, Kind: k}
	if m.ORT() {
		l.Hidden, l.Attn = ortLayerInputs(f)
		return l
	}
	l.Hidden, l.Attn, l.States = layerInputs(f, m.Export, m.positionRank(), k.caches(m), m.slotsCache())
	return l
}

// Weight declares the layer tensor name (under the layer's prefix) of the
// given shape as a formal input, bound as stored.
func (l *Layer) Weight(name string, shape ...int64) fn.Value {
	return l.Computed(name, func(i int32) weight.Expr { return weight.Tensor(l.Model.LayerKey(i, name), shape...) })
}

// Computed declares formal input name, bound for layer i to bind(i): an
// expression over checkpoint tensors (stacked experts, dequantised blocks).
func (l *Layer) Computed(name string, bind func(layer int32) weight.Expr) fn.Value {
	l.declared = append(l.declared, declaredWeight{input: name, bind: bind})
	return l.Input(name)
}

// Linear declares an nn.Linear called name: weight [out, in], and bias
// [out] when bias is set.
func (l *Layer) Linear(name string, out, in int, bias bool) blocks.Linear {
	lin := blocks.Linear{Weight: l.Weight(name+".weight", int64(out), int64(in)), ORT: l.Model.ORT()}
	if bias {
		lin.Bias = l.Weight(name+".bias", int64(out))
	}
	return lin
}

// FusedLinears declares nn.Linears names[i] of outs[i] outputs (formal
// inputs <name>.weight [out, in], and <name>.bias [out] when bias is set),
// bound to consecutive row blocks of the one stored projection fused
// (<fused>.weight [Σouts, in]), in the order given: the graph is that of
// separate projections, the checkpoint read as stored. For Phi-3:
//
//	l.FusedLinears("self_attn.qkv_proj", []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, []int{q, kv, kv}, h, false)
func (l *Layer) FusedLinears(fused string, names []string, outs []int, in int, bias bool) []blocks.Linear {
	total := int64(0)
	for _, o := range outs {
		total += int64(o)
	}
	lins := make([]blocks.Linear, len(names))
	start := int64(0)
	for i, name := range names {
		lo, hi := start, start+int64(outs[i])
		lins[i].ORT = l.Model.ORT()
		lins[i].Weight = l.Computed(name+".weight", func(layer int32) weight.Expr {
			return weight.Slice(weight.Tensor(l.Model.LayerKey(layer, fused+".weight"), total, int64(in)), 0, lo, hi, 1)
		})
		if bias {
			lins[i].Bias = l.Computed(name+".bias", func(layer int32) weight.Expr {
				return weight.Slice(weight.Tensor(l.Model.LayerKey(layer, fused+".bias"), total), 0, lo, hi, 1)
			})
		}
		start = hi
	}
	return lins
}

// projections declares nn.Linears names (out[i] × in): separate, or rows
// of the stored projection fused when it is not "".
func (l *Layer) projections(fused string, names []string, outs []int, in int, bias bool) []blocks.Linear {
	if fused != "" {
		return l.FusedLinears(fused, names, outs, in, bias)
	}
	lins := make([]blocks.Linear, len(names))
	for i, name := range names {
		lins[i] = l.Linear(name, outs[i], in, bias)
	}
	return lins
}

// Context declares a context value (one the model added with AddContext)
// as an input of the layer.
func (l *Layer) Context(name string) fn.Value { return l.Input(name) }

// Output declares the layer's outputs: the hidden state and each cache's
// retained state, in the kind's cache order.
func (l *Layer) Output(hidden fn.Value, caches ...fn.Value) {
	if l.Kind.Post != nil {
		hidden = l.Kind.Post(l, hidden)
	}
	l.Func.Output(sdk.HiddenStatesOut, hidden)
	specs := l.Kind.caches(l.Model)
	for i, c := range caches {
		l.Func.Output(specs[i].GetName()+sdk.RetainedSuffix, c)
	}
	l.finished = true
}

// Block is a layer's sub-block with weights: Declare declares them (in
// input order), Apply computes the block on x.
type Block interface {
	Declare(l *Layer)
	Apply(l *Layer, f *fn.Func, x fn.Value) (fn.Value, error)
}

// PreNorm is the pre-norm residual layer most decoders have:
// h = x + attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h)),
// with the norms' weights named as transformers names them.
func (l *Layer) PreNorm(attn *Attention, mlp Block) error {
	return l.Residual(attn, Norms{Pre: "input_layernorm"}, mlp, Norms{Pre: "post_attention_layernorm"})
}

// Norms places the RMSNorms of a residual branch: Pre norms the branch's
// input, Post its output before the residual add. Each is the norm's name
// in the layer (its weight <name>.weight [hidden], as transformers names
// it), or "" for none.
type Norms struct{ Pre, Post string }

// Residual is a layer of two residual branches, attention then the MLP,
// each normed where its Norms say:
// h = x + Post(attn(Pre(x))); out = h + Post(mlp(Pre(h))).
// PreNorm is the pre-only case; OLMo-2 is post-only:
//
//	l.Residual(attn, Norms{Post: "post_attention_layernorm"}, mlp, Norms{Post: "post_feedforward_layernorm"})
//
// and Gemma-2/3 have both.
func (l *Layer) Residual(attn *Attention, attnNorms Norms, mlp Block, mlpNorms Norms) error {
	return l.MixerResidual(attn, attnNorms, mlp, mlpNorms)
}

// Mixer is a layer's token mixer: attention, or a linear attention with
// states of its own. Mix returns its output and the retained state of each
// of the kind's caches, in the kind's order.
type Mixer interface {
	Declare(l *Layer)
	Mix(l *Layer, f *fn.Func, x fn.Value) (out fn.Value, caches []fn.Value)
	// Scope names the mixer's nodes and weights: self_attn, linear_attn.
	Scope() string
}

// MixerResidual is Residual with any token mixer:
// h = x + Post(mix(Pre(x))); out = h + Post(mlp(Pre(h))).
func (l *Layer) MixerResidual(mix Mixer, mixNorms Norms, mlp Block, mlpNorms Norms) error {
	mixW := mixNorms.declare(l, func() { mix.Declare(l) })
	mlpW := mlpNorms.declare(l, func() { mlp.Declare(l) })
	if l.Model.ORT() { // after Declare: the blocks know their settings
		if why := ortUnmapped(l, mix, mlp); why != "" {
			return fmt.Errorf("--target ort: layer kind %s does not map onto ONNX Runtime's decoder form: %s; export it without --target ort", l.Kind.Name, why)
		}
	}

	// With the ORT form the residual add after the mixer and the MLP's
	// pre-norm are one SkipSimplifiedLayerNormalization.
	next := fusedNorm{}
	if l.Model.norm().Fused() && mlpNorms.Pre != "" {
		next = fusedNorm{mlpNorms.Pre, mlpW.pre}
	}
	var caches []fn.Value
	hidden, normed, err := mixNorms.apply(l, mixW, l.Hidden, "", next, func(x fn.Value) (out fn.Value, err error) {
		out, caches = mix.Mix(l, l.Scope(mix.Scope()), x)
		return out, nil
	})
	if err != nil {
		return err
	}
	out, _, err := mlpNorms.apply(l, mlpW, hidden, normed, fusedNorm{}, func(x fn.Value) (fn.Value, error) {
		return mlp.Apply(l, l.Scope("mlp"), x)
	})
	if err != nil {
		return err
	}
	l.Output(out, caches...)
	return nil
}

// normWeights are a branch's declared norm weights ("" where none).
type normWeights struct{ pre, post fn.Value }

// declare declares the pre-norm's weight, the branch's (declareBranch),
// then the post-norm's, in input order.
func (n Norms) declare(l *Layer, declareBranch func()) normWeights {
	var w normWeights
	h := int64(l.Model.Hidden)
	if n.Pre != "" {
		w.pre = l.Weight(n.Pre+".weight", h)
	}
	declareBranch()
	if n.Post != "" {
		w.post = l.Weight(n.Post+".weight", h)
	}
	return w
}

// fusedNorm is the norm (scope, weight) the residual add is fused into
// (blocks.SkipSimplifiedRMSNorm), none when empty.
type fusedNorm struct {
	name   string
	weight fn.Value
}

// apply is x + Post(branch(Pre(x))), Pre(x) being normed when the add
// before fused it; with next, also next's norm of that sum, fused.
func (n Norms) apply(l *Layer, w normWeights, x, normed fn.Value, next fusedNorm, branch func(fn.Value) (fn.Value, error)) (sum, nextNormed fn.Value, err error) {
	in := normed
	if in == "" {
		in = x
		if n.Pre != "" {
			in = l.Model.norm().Apply(l.Scope(n.Pre), x, w.pre)
		}
	}
	out, err := branch(in)
	if err != nil {
		return "", "", err
	}
	if n.Post != "" {
		out = l.Model.norm().Apply(l.Scope(n.Post), out, w.post)
	}
	if next.name == "" {
		return l.Add(x, out), "", nil
	}
	nextNormed, sum = blocks.SkipSimplifiedRMSNorm(l.Scope(next.name), x, out, next.weight, l.Model.Eps)
	return sum, nextNormed, nil
}

// Attention is self-attention named as transformers names it
// (self_attn.{q,k,v,o}_proj), with the model's heads, head_dim and RoPE.
type Attention struct {
	QKVBias, OBias bool // biases of the q/k/v and of the o projection
	QKNorm         bool // per-head RMSNorm of queries and keys before RoPE (self_attn.{q,k}_norm)
	// QKNormAllHeads (with QKNorm) norms all heads' queries, and all keys,
	// as one vector before the split into heads: weights [heads*head_dim]
	// and [kv_heads*head_dim] (OLMo-2), not [head_dim] (Qwen3).
	QKNormAllHeads bool
	Sinks          bool // a learned per-head logit joining the softmax (self_attn.sinks, gpt-oss)
	Scaling        float64
	// SoftCap, when not 0, soft-caps the scaled scores before the mask:
	// SoftCap·tanh(scores/SoftCap) (Gemma-2's attn_logit_softcapping).
	SoftCap float64
	// FusedQKV names one stored projection holding q, k and v's rows in
	// that order ("self_attn.qkv_proj", Phi-3), bound by FusedLinears;
	// "" for separate q_proj, k_proj, v_proj.
	FusedQKV string
	// RoPE names the tables a model added with AddRoPE that this attention
	// turns by; the model's RoPE when empty.
	RoPE string
	// Mask is the context value masking the scores: CtxMask when empty, or
	// one the model added (a sliding-window mask).
	Mask string
	// OutputGate: q_proj holds, per head, the query's head_dim rows then
	// a gate's, and the heads' output is multiplied by sigmoid(gate)
	// before o_proj (Qwen3-Next, Qwen3.5: self_attn.q_proj [heads·2·head_dim, hidden]).
	OutputGate bool

	block blocks.Attention
}

// Declare declares the projections, norms and sinks.
func (a *Attention) Declare(l *Layer) {
	m := l.Model
	q, kv, h := m.Heads*m.HeadDim, m.KVHeads*m.HeadDim, m.Hidden
	names := []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}
	var qkv []blocks.Linear
	var gate blocks.Linear
	if a.OutputGate { // q and gate rows of the one q_proj, then k and v
		var query blocks.Linear
		query, gate = a.gatedQuery(l)
		qkv = append([]blocks.Linear{query}, l.projections(a.FusedQKV, names[1:], []int{kv, kv}, h, a.QKVBias)...)
	} else {
		qkv = l.projections(a.FusedQKV, names, []int{q, kv, kv}, h, a.QKVBias) // declared before o_proj
	}
	a.block = blocks.Attention{Q: qkv[0], K: qkv[1], V: qkv[2], Heads: m.Heads, KVHeads: m.KVHeads, HeadDim: m.HeadDim, RoPE: m.RoPE, Scaling: a.Scaling,
		SoftCap: a.SoftCap, O: l.Linear("self_attn.o_proj", h, q, a.OBias), Gate: gate,
	}
	switch {
	case a.QKNorm && a.QKNormAllHeads:
		a.block.QNorm = l.Weight("self_attn.q_norm.weight", int64(q))
		a.block.KNorm = l.Weight("self_attn.k_norm.weight", int64(kv))
		a.block.NormEps, a.block.NormAllHeads, a.block.NormOnePlus = m.Eps, true, m.NormOnePlus
	case a.QKNorm:
		a.block.QNorm = l.Weight("self_attn.q_norm.weight", int64(m.HeadDim))
		a.block.KNorm = l.Weight("self_attn.k_norm.weight", int64(m.HeadDim))
		a.block.NormEps, a.block.NormOnePlus = m.Eps, m.NormOnePlus
	case a.QKNormAllHeads:
		m.Fail(fmt.Errorf("%s: the attention sets QKNormAllHeads without QKNorm", m.Config.Path()))
	}
	if a.Sinks {
		a.block.Sinks = l.Weight("self_attn.sinks", int64(m.Heads))
	}
	switch {
	case a.Mask == "" || a.Mask == CtxMask:
	case m.ORT(): // a sliding window is GQA's local_window_size; ORTUnmapped refuses other masks
		a.block.LocalWindow = m.contextWindow(a.Mask)
	default:
		l.Attn.Mask = l.Context(a.Mask)
	}
	if a.RoPE != "" {
		rope, ok := m.ropes[a.RoPE]
		if !ok {
			m.Fail(fmt.Errorf("the attention turns by RoPE %q, which the plugin did not add (Model.AddRoPE)", a.RoPE))
			return
		}
		a.block.RoPE = rope
		l.Attn.Cos, l.Attn.Sin = l.Context(ropeCos(a.RoPE)), l.Context(ropeSin(a.RoPE))
	}
}

// gatedQuery declares the query and its output gate from the one stored
// self_attn.q_proj whose rows are, per head, head_dim of the query then
// head_dim of the gate (formal inputs self_attn.q_proj.* and self_attn.gate_proj.*).
func (a *Attention) gatedQuery(l *Layer) (query, gate blocks.Linear) {
	m := l.Model
	heads, hd, h := int64(m.Heads), int64(m.HeadDim), int64(m.Hidden)
	if a.FusedQKV != "" {
		m.Fail(fmt.Errorf("%s: the attention sets OutputGate with FusedQKV", m.Config.Path()))
	}
	half := func(name string, part int64, shape ...int64) fn.Value {
		return l.Computed(name, func(i int32) weight.Expr {
			stored := weight.Tensor(m.LayerKey(i, "self_attn.q_proj."+shape0(shape)), append([]int64{heads * 2 * hd}, shape...)...)
			perHead := weight.Reshape(stored, append([]int64{heads, 2 * hd}, shape...)...)
			return weight.Reshape(weight.Slice(perHead, 1, part*hd, (part+1)*hd, 1), append([]int64{heads * hd}, shape...)...)
		})
	}
	query.Weight, gate.Weight = half("self_attn.q_proj.weight", 0, h), half("self_attn.gate_proj.weight", 1, h)
	if a.QKVBias {
		query.Bias, gate.Bias = half("self_attn.q_proj.bias", 0), half("self_attn.gate_proj.bias", 1)
	}
	return query, gate
}

// shape0 is the stored tensor's name suffix: weight with a trailing
// dimension, bias without.
func shape0(trailing []int64) string {
	if len(trailing) > 0 {
		return "weight"
	}
	return "bias"
}

// Mix is Apply as a Mixer: the output and the key and value caches.
func (a *Attention) Mix(l *Layer, f *fn.Func, x fn.Value) (fn.Value, []fn.Value) {
	out, key, value := a.Apply(l, f, x)
	return out, []fn.Value{key, value}
}

// Scope is self_attn.
func (a *Attention) Scope() string { return "self_attn" }

// Apply computes attention on x; it returns the output and the updated
// key and value caches.
func (a *Attention) Apply(l *Layer, f *fn.Func, x fn.Value) (out, key, value fn.Value) {
	return a.block.Apply(f, x, l.Attn)
}

// SwiGLU is a gated MLP named as transformers names it: <Name>.gate_proj,
// up_proj, down_proj of width Width (Name "mlp" when empty), its
// activation Act (SiLU when empty; Gemma's GeGLU: blocks.ActGELUTanh).
type SwiGLU struct {
	Name  string
	Width int
	Bias  bool
	Act   blocks.Activation
	// FusedGateUp names one stored projection holding gate's rows, then
	// up's ("mlp.gate_up_proj", Phi-3), bound by FusedLinears; "" for
	// separate gate_proj and up_proj.
	FusedGateUp string

	block blocks.SwiGLU
}

// Declare declares the three projections.
func (s *SwiGLU) Declare(l *Layer) {
	name := s.Name
	if name == "" {
		name = "mlp"
	}
	if s.Width <= 0 {
		l.Model.Fail(fmt.Errorf("%s: the MLP width must be positive, got %d", l.Model.Config.Path(), s.Width))
	}
	h := l.Model.Hidden
	gateUp := l.projections(s.FusedGateUp, []string{name + ".gate_proj", name + ".up_proj"}, []int{s.Width, s.Width}, h, s.Bias)
	s.block = blocks.SwiGLU{
		Gate: gateUp[0],
		Up:   gateUp[1],
		Down: l.Linear(name+".down_proj", h, s.Width, s.Bias),
		Act:  s.Act,
	}
	if !s.Act.Known() {
		l.Model.Fail(fmt.Errorf("%s: unknown MLP activation %q (known: %v)", l.Model.Config.Path(), string(s.Act), blocks.Activations))
	}
}

// Apply computes the MLP.
func (s *SwiGLU) Apply(_ *Layer, f *fn.Func, x fn.Value) (fn.Value, error) {
	return s.block.Apply(f, x), nil
}
