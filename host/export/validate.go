package export

import (
	"fmt"
	"slices"
	"strings"

	"github.com/strata-llm/strata/host/window"
	suggestpkg "github.com/strata-llm/strata/internal/suggest"
	"github.com/strata-llm/strata/sdk"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// A plugin is untrusted input. Every part it returns is checked here, as it
// arrives and before anything is assembled or written, against the rules the
// assembler wires parts by (assemble.go): every formal input is passed by the
// host or bound to a weight in every layer, the formal outputs are exactly
// those the host reads (a cache's <name>_RetainedState among them), and the
// body is well formed: each node reads values defined before it, defines
// each value once and is of a domain the function imports. This is the one
// place that says so; the assembler and graph.Inline rely on it. The check
// runs once per part function (not per layer), in map lookups linear in its
// nodes and bindings.

// partContract is what the host passes one part function and reads back.
type partContract struct {
	label string // "embed", `layer kind "decoder"`, `model "embed"`
	// passes maps each formal input the host passes to what it is: one of
	// the role* kinds below; passOrder are they in the order given.
	passes    map[string]string
	passOrder []string
	// idle are inputs of the contract this export does not pass, and why.
	idle map[string]string
	// reads are the formal outputs the host reads; caches maps those that
	// are a cache's retained state to the cache.
	reads  []string
	caches map[string]string
	// layers the part binds weights for: sdk.NonLayer for parts other than
	// layers.
	layers []int32
}

// Kinds of the values the host passes, as messages list them.
const (
	roleInput   = "inputs"
	roleCache   = "caches"
	roleContext = "context values"
	roleServing = "serving inputs"
	roleExtra   = "the plan's extra inputs"
)

var roleOrder = []string{roleInput, roleCache, roleContext, roleServing, roleExtra}

// contracts derives each part's contract from the plan and the options, as
// assemble.go wires them.
type contracts struct {
	plan    *pb.PlanResponse
	serving window.Serving
	// windowSize is the layers per window of a layerwise export; 0: whole.
	windowSize int
	// ort: onnxruntime-genai's IO, which has no position_ids (--target ort).
	ort bool
}

// positions is position_ids as a passed input, or none with --target ort.
func (c contracts) positions() []string {
	if c.ort {
		return nil
	}
	return []string{sdk.PositionIDs}
}

// of is the contract of a part the plan asks for (kind: a layer kind's name).
func (c contracts) of(part, kind string) partContract {
	switch part {
	case sdk.PartEmbed:
		return c.embed()
	case sdk.PartContext:
		return c.context()
	case sdk.PartLayer:
		return c.layer(kindIndex(c.plan)[kind])
	}
	return c.final()
}

func (c contracts) common(label string, layers []int32, inputs ...string) partContract {
	pc := partContract{label: label, passes: map[string]string{}, idle: map[string]string{}, layers: layers, caches: map[string]string{}}
	for _, in := range inputs {
		pc.pass(in, roleInput)
	}
	enabled := c.serving.Inputs()
	for _, name := range []string{sdk.CompCtxLengths, sdk.BatchIndex} {
		if slices.Contains(enabled, name) {
			pc.pass(name, roleServing)
		} else {
			pc.idle[name] = "the host passes it only with " + servingFlag[name]
		}
	}
	for _, x := range c.plan.GetExtraInputs() {
		pc.pass(x.GetName(), roleExtra)
	}
	for _, name := range c.plan.GetContextOutputs() {
		if _, ok := pc.passes[name]; !ok {
			pc.idle[name] = "the host passes context values to layers only"
		}
	}
	return pc
}

func (c contracts) embed() partContract {
	pc := c.common(sdk.PartEmbed, []int32{sdk.NonLayer}, sdk.InputIDs)
	pc.reads = []string{sdk.HiddenStates}
	return pc
}

// context: a cache input is bound to the first layer of each window that
// has a cache of that name (assemble.go), so it may read any kind's cache.
func (c contracts) context() partContract {
	pc := c.common(sdk.PartContext, []int32{sdk.NonLayer}, c.positions()...)
	pc.reads = c.plan.GetContextOutputs()
	for _, k := range c.plan.GetKinds() {
		for _, cache := range k.GetCaches() {
			pc.pass(cache.GetName(), roleCache)
		}
	}
	return pc
}

func (c contracts) layer(kind *pb.LayerKind) partContract {
	pc := c.common(fmt.Sprintf("layer kind %q", kind.GetName()), layersOf(c.plan, kind.GetName()), append([]string{sdk.HiddenStates}, c.positions()...)...)
	pc.reads = []string{sdk.HiddenStatesOut}
	for _, cache := range kind.GetCaches() {
		pc.pass(cache.GetName(), roleCache)
		out := cache.GetName() + sdk.RetainedSuffix
		pc.reads = append(pc.reads, out)
		pc.caches[out] = cache.GetName()
	}
	for _, name := range c.plan.GetContextOutputs() {
		pc.pass(name, roleContext)
		delete(pc.idle, name)
	}
	return pc
}

func (c contracts) final() partContract {
	pc := c.common(sdk.PartFinal, []int32{sdk.NonLayer}, append([]string{sdk.HiddenStates}, c.positions()...)...)
	pc.reads = []string{sdk.Logits}
	for _, x := range c.plan.GetExtraOutputs() {
		formal := x.GetPartOutput()
		if formal == "" {
			formal = x.GetName()
		}
		pc.reads = append(pc.reads, formal)
	}
	return pc
}

// separateContract is a separate model's: its declared inputs and outputs
// (buildSeparate passes no serving or extra inputs).
func separateContract(spec *pb.ModelSpec) partContract {
	pc := partContract{label: fmt.Sprintf("model %q", spec.GetName()), passes: map[string]string{}, idle: map[string]string{},
		layers: []int32{sdk.NonLayer}, caches: map[string]string{}}
	for _, in := range spec.GetInputs() {
		pc.pass(in.GetName(), roleInput)
	}
	for _, out := range spec.GetOutputs() {
		pc.reads = append(pc.reads, out.GetName())
	}
	return pc
}

// pass records that the host passes the part name, a value of role (the
// first role given stands: messages name one).
func (pc *partContract) pass(name, role string) {
	if _, ok := pc.passes[name]; !ok {
		pc.passes[name] = role
		pc.passOrder = append(pc.passOrder, name)
	}
}

// maxProblems bounds the problems one error lists.
const maxProblems = 8

// problems collects what is wrong with one part, the first maxProblems in
// words (the rest only counted: describing them costs suggestions).
type problems struct {
	list []string
	more int
}

// full says no more problems will be listed: a caller skips the work of
// describing one.
func (p *problems) full() bool { return len(p.list) >= maxProblems }

func (p *problems) add(format string, args ...any) {
	if p.full() {
		p.more++
		return
	}
	p.list = append(p.list, fmt.Sprintf(format, args...))
}

// check validates resp, the part pc describes, built by plugin.
func (pc partContract) check(plugin string, resp *pb.BuildResponse) error {
	var p problems
	fn := resp.GetFunction()
	pc.checkInputs(&p, resp)
	pc.checkOutputs(&p, fn)
	checkBody(&p, "", fn, false)
	for _, dep := range resp.GetDependencies() {
		checkBody(&p, fmt.Sprintf("function %s it calls: ", qualified(dep)), dep, true)
	}
	if len(p.list) == 0 {
		return nil
	}
	msg := strings.Join(p.list, "; ")
	if p.more > 0 {
		msg += fmt.Sprintf("; and %d more", p.more)
	}
	return fmt.Errorf("plugin %s: part %s: %s", plugin, pc.label, msg)
}

// checkInputs requires every formal input to be passed by the host or bound
// to a weight for every layer of the part, and every binding to name a
// formal input the host does not pass.
func (pc partContract) checkInputs(p *problems, resp *pb.BuildResponse) {
	fn := resp.GetFunction()
	formal := make(map[string]bool, len(fn.GetInput()))
	for _, in := range fn.GetInput() {
		if formal[in] {
			p.add("declares input %q twice", in)
		}
		formal[in] = true
	}
	// Each layer's bindings (the first entry for it, as layerBindings
	// reads them).
	want := make(map[int32]bool, len(pc.layers))
	for _, l := range pc.layers {
		want[l] = true
	}
	entries := make(map[int32]*pb.LayerWeights, len(pc.layers))
	for _, lw := range resp.GetWeights() {
		if want[lw.GetLayer()] && entries[lw.GetLayer()] == nil {
			entries[lw.GetLayer()] = lw
		}
	}
	missing := 0
	for _, l := range pc.layers {
		if entries[l] == nil && !(l == sdk.NonLayer && len(resp.GetWeights()) == 0) {
			missing++
			p.add("no weight bindings for layer %s", layerName(l))
		}
	}
	bound := map[string]int{} // formal input -> layers binding it
	reported := map[string]bool{}
	for _, l := range pc.layers {
		lw := entries[l]
		if lw == nil {
			continue
		}
		inLayer := make(map[string]bool, len(lw.GetBindings()))
		for _, wb := range lw.GetBindings() {
			in := wb.GetInput()
			switch {
			case inLayer[in]:
				p.add("binds input %q twice for layer %s", in, layerName(l))
				continue
			case !formal[in]:
				if !reported[in] {
					reported[in] = true
					p.add("binds %s to input %q, which the function does not declare%s", bindingName(wb), in, suggest(in, fn.GetInput()))
				}
			case pc.passes[in] != "":
				if !reported[in] {
					reported[in] = true
					p.add("binds %s to input %q, which the host passes (one of the %s)", bindingName(wb), in, pc.passes[in])
				}
			}
			inLayer[in] = true
			bound[in]++
		}
	}
	// A kind no layer has binds nothing; a part whose layers' bindings are
	// missing (said above) is not checked further.
	layers := len(entries)
	vacuous := layers == 0 && (len(pc.layers) == 0 || missing > 0)
	var unbound []string
	for _, in := range fn.GetInput() {
		switch {
		case pc.passes[in] != "":
		case bound[in] == layers && (layers > 0 || vacuous):
		case bound[in] > 0:
			p.add("input %q is bound to a weight for some layers but not for layer %s", in, pc.unboundLayer(in, entries))
		case pc.idle[in] != "":
			p.add("input %q is bound to nothing: %s, and no weight binding names it", in, pc.idle[in])
		default:
			unbound = append(unbound, in)
		}
	}
	switch {
	case len(unbound) == 0:
	case p.full():
		p.more++
	case len(unbound) == 1:
		p.add("input %q is bound to nothing: no weight binding names it and the host does not pass it (it passes %s)%s",
			unbound[0], pc.passed(), suggest(unbound[0], pc.inputCandidates(resp)))
	default:
		candidates := pc.inputCandidates(resp)
		named := make([]string, 0, len(unbound))
		for _, in := range unbound[:min(len(unbound), 12)] {
			if q := suggestpkg.DidYouMean(in, candidates); q != "" {
				named = append(named, fmt.Sprintf("%q (%s)", in, q))
			} else {
				named = append(named, fmt.Sprintf("%q", in))
			}
		}
		if len(unbound) > 12 {
			named = append(named, fmt.Sprintf("and %d more", len(unbound)-12))
		}
		p.add("inputs %s are bound to nothing: no weight binding names them and the host does not pass them (it passes %s)",
			strings.Join(named, ", "), pc.passed())
	}
}

// unboundLayer is the first of the part's layers that binds no weight to in.
func (pc partContract) unboundLayer(in string, entries map[int32]*pb.LayerWeights) string {
	for _, l := range pc.layers {
		if lw := entries[l]; lw != nil && !slices.ContainsFunc(lw.GetBindings(), func(wb *pb.WeightBinding) bool { return wb.GetInput() == in }) {
			return layerName(l)
		}
	}
	return "?"
}

// passed lists what the host passes the part, by kind.
func (pc partContract) passed() string {
	byRole := map[string][]string{}
	for _, name := range pc.passOrder {
		byRole[pc.passes[name]] = append(byRole[pc.passes[name]], name)
	}
	var groups []string
	for _, role := range roleOrder {
		if names := byRole[role]; len(names) > 0 {
			groups = append(groups, "the "+role+" "+strings.Join(names, ", "))
		}
	}
	if len(groups) == 0 {
		return "nothing"
	}
	return strings.Join(groups, "; ")
}

// inputCandidates are the names a formal input could have been meant to
// be: what the host passes, and the inputs weights are bound to.
func (pc partContract) inputCandidates(resp *pb.BuildResponse) []string {
	names := slices.Clone(pc.passOrder)
	for name := range pc.idle {
		names = append(names, name)
	}
	if ws := resp.GetWeights(); len(ws) > 0 { // every layer binds the same inputs
		for _, wb := range ws[0].GetBindings() {
			names = append(names, wb.GetInput())
		}
	}
	return names
}

// checkOutputs requires the formal outputs to be exactly those the host
// reads.
func (pc partContract) checkOutputs(p *problems, fn *onnxpb.FunctionProto) {
	outs := make(map[string]bool, len(fn.GetOutput()))
	for _, o := range fn.GetOutput() {
		if outs[o] {
			p.add("declares output %q twice", o)
		}
		outs[o] = true
	}
	reads := make(map[string]bool, len(pc.reads))
	for _, r := range pc.reads {
		reads[r] = true
		if outs[r] {
			continue
		}
		if cache := pc.caches[r]; cache != "" {
			p.add("the kind declares cache %q, but the function has no output %q, its retained state (outputs: %s)", cache, r, list(fn.GetOutput()))
		} else {
			p.add("has no output %q, which the host reads (outputs: %s)", r, list(fn.GetOutput()))
		}
	}
	for _, o := range fn.GetOutput() {
		if !reads[o] {
			p.add("declares output %q, which the host does not read (it reads %s)%s", o, list(pc.reads), suggest(o, pc.reads))
		}
	}
}

// checkBody requires each node of fn to read only values defined before it
// (formal inputs, earlier nodes' outputs), to define values no one else
// does, and to be of a domain fn imports; and each formal output to be some
// node's. A dependency's formal inputs are checked here, a part's by
// checkInputs.
func checkBody(p *problems, where string, fn *onnxpb.FunctionProto, dependency bool) {
	imported := make(map[string]bool, len(fn.GetOpsetImport()))
	for _, op := range fn.GetOpsetImport() {
		imported[canonicalDomain(op.GetDomain())] = true
	}
	// defined: value -> the index of the node defining it, -1 for a formal input.
	defined := make(map[string]int, len(fn.GetInput())+len(fn.GetNode()))
	for _, in := range fn.GetInput() {
		if _, twice := defined[in]; twice && dependency {
			p.add("%sdeclares input %q twice", where, in)
		}
		defined[in] = -1
	}
	nodes := fn.GetNode()
	for i, n := range nodes {
		if !imported[canonicalDomain(n.GetDomain())] {
			p.add("%s%s is of domain %q, which the function does not import (it imports: %s)", where, nodeName(n, i), domainName(n.GetDomain()), importList(fn))
		}
		for _, in := range n.GetInput() {
			if in == "" {
				continue
			}
			if _, ok := defined[in]; ok {
				continue
			}
			if p.full() {
				p.more++
				continue
			}
			p.add("%s%s reads %q, which nothing in the function defines (inputs: %s%s)", where, nodeName(n, i), in, list(fn.GetInput()), suggestDefined(in, defined))
		}
		for _, out := range n.GetOutput() {
			if out == "" {
				continue
			}
			if j, ok := defined[out]; ok {
				if j < 0 {
					p.add("%s%s writes %q, which is a formal input", where, nodeName(n, i), out)
				} else {
					p.add("%s%s writes %q, which %s already defines", where, nodeName(n, i), out, nodeName(nodes[j], j))
				}
				continue
			}
			defined[out] = i
		}
	}
	for _, out := range fn.GetOutput() {
		if j, ok := defined[out]; !ok || j < 0 {
			p.add("%sdeclares output %q, which no node produces", where, out)
		}
	}
}

func nodeName(n *onnxpb.NodeProto, i int) string {
	op := n.GetOpType()
	if n.GetDomain() != "" {
		op = n.GetDomain() + "." + op
	}
	if n.GetName() == "" {
		return fmt.Sprintf("node #%d (%s)", i, op)
	}
	return fmt.Sprintf("node %q (%s)", n.GetName(), op)
}

func qualified(fn *onnxpb.FunctionProto) string {
	if fn.GetDomain() == "" {
		return fn.GetName()
	}
	return fn.GetDomain() + "." + fn.GetName()
}

// canonicalDomain is the domain as opset imports match it: "" and
// "ai.onnx" are the default domain.
func canonicalDomain(d string) string {
	if d == "ai.onnx" {
		return ""
	}
	return d
}

func domainName(d string) string {
	if d == "" {
		return "ai.onnx"
	}
	return d
}

func importList(fn *onnxpb.FunctionProto) string {
	var ds []string
	for _, op := range fn.GetOpsetImport() {
		ds = append(ds, domainName(op.GetDomain()))
	}
	if len(ds) == 0 {
		return "nothing"
	}
	return strings.Join(ds, ", ")
}

func bindingName(wb *pb.WeightBinding) string {
	if wb.GetKey() != "" {
		return fmt.Sprintf("weight %q", wb.GetKey())
	}
	return "a weight"
}

// list names up to a dozen values, and how many more there are.
func list(names []string) string {
	const most = 12
	if len(names) == 0 {
		return "none"
	}
	if len(names) <= most {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s, and %d more", strings.Join(names[:most], ", "), len(names)-most)
}

// suggestDefined suggests the values defined so far closest to name.
func suggestDefined(name string, defined map[string]int) string {
	names := make([]string, 0, len(defined))
	for v := range defined {
		names = append(names, v)
	}
	return suggest(name, names)
}

// suggest is "; did you mean X?" for the candidates closest to name, or "".
func suggest(name string, candidates []string) string {
	if q := suggestpkg.DidYouMean(name, candidates); q != "" {
		return "; " + q
	}
	return ""
}
