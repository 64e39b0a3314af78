package export

import (
	"fmt"
	"slices"
	"sync"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/quant"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/host/window"
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/dtype"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// parts is everything the plugin built for one model.
type parts struct {
	plan    *pb.PlanResponse
	embed   *pb.BuildResponse
	context *pb.BuildResponse
	kinds   map[string]*pb.BuildResponse // layer kind -> its function and per-layer bindings
	final   *pb.BuildResponse
}

// Window boundary names: a window after the first takes the hidden state as
// this graph input; one before the last returns it as that graph output.
const (
	windowHiddenIn  = window.BoundaryIn
	windowHiddenOut = window.BoundaryOut
)

// assembler places the parts of one window (the whole model being the
// window of all layers) in one graph.
type assembler struct {
	parts        parts
	compute      dtype.DType
	b            *graph.Builder
	table        *weights.Table
	kinds        map[string]*pb.LayerKind
	span         window.Span
	subfunctions bool // layers as calls of local functions, else inlined
	serving      window.Serving
	// read records which serving inputs some part declared.
	read map[string]bool
	// ort: onnxruntime-genai's IO (--target ort; window.ModelIO.ORT).
	ort bool
	// prepared brings each layer's bindings, in order, prepared
	// (weights.Table.Prepare) while the layer before is placed.
	prepared <-chan []weights.Prepared
}

func newAssembler(ps parts, ckpt *checkpoint.Checkpoint, q *quant.View, compute dtype.DType, s window.Span, subfunctions bool, srv window.Serving, mode, dataPath string) *assembler {
	b := graph.New(ps.plan.GetModelType())
	table := weights.NewTable(ckpt, q, compute, b, mode, dataPath)
	if s.IsFirst() && s.IsLast() {
		table.Reserve(len(ckpt.Sorted()))
	}
	return &assembler{parts: ps, compute: compute, b: b, table: table,
		kinds: kindIndex(ps.plan), span: s, subfunctions: subfunctions, serving: srv, read: map[string]bool{}}
}

// Value names in the assembled graph.
func layerPrefix(i int32) string      { return window.LayerPrefix(i) }
func contextValue(name string) string { return "context/" + name }

// layers are the plan's layers inside the span.
func (a *assembler) layers() []*pb.Layer {
	return a.parts.plan.GetLayers()[a.span.First : a.span.Last+1]
}

func (a *assembler) run() error {
	if err := a.declareIO(); err != nil {
		return err
	}
	hidden := windowHiddenIn
	if a.span.IsFirst() && a.parts.plan.GetInputsEmbeds() {
		hidden = sdk.InputsEmbeds
	} else if a.span.IsFirst() {
		hidden = "embed/" + sdk.HiddenStates
		if err := a.place(a.parts.embed, sdk.NonLayer, "embed",
			map[string]string{sdk.InputIDs: sdk.InputIDs},
			map[string]string{sdk.HiddenStates: hidden}); err != nil {
			return err
		}
	}
	if err := a.placeContext(); err != nil {
		return err
	}
	sums := map[string]bool{} // the hidden states between parts
	stop := make(chan struct{})
	var prepare sync.WaitGroup
	defer func() { close(stop); prepare.Wait() }() // no goroutine outlives the assembly
	a.prepared = a.prepareLayers(stop, &prepare)
	for _, l := range a.layers() {
		var err error
		if hidden, err = a.placeLayer(l, hidden); err != nil {
			return err
		}
		sums[hidden] = true
	}
	if a.span.IsLast() {
		outputs := map[string]string{sdk.Logits: sdk.Logits}
		for _, x := range a.parts.plan.GetExtraOutputs() {
			formal := x.GetPartOutput()
			if formal == "" {
				formal = x.GetName()
			}
			outputs[formal] = window.ExtraOutputName(a.span, x.GetName())
		}
		if err := a.place(a.parts.final, sdk.NonLayer, "final",
			map[string]string{sdk.HiddenStates: hidden, sdk.PositionIDs: sdk.PositionIDs}, outputs); err != nil {
			return err
		}
	}
	if a.ort && !a.subfunctions {
		// ONNX Runtime's form: a layer's last residual add and the next
		// part's first norm, which no part can fuse alone.
		if _, err := a.b.FuseResidualNorms(sums); err != nil {
			return err
		}
	}
	return a.checkServingInputsRead()
}

// checkServingInputsRead refuses a serving mode the plugin ignored: its
// parts would compute as if the input were absent.
func (a *assembler) checkServingInputsRead() error {
	for _, name := range a.serving.Inputs() {
		if !a.read[name] {
			return fmt.Errorf("none of the plugin's parts reads %s: it does not support %s", name, servingFlag[name])
		}
	}
	return nil
}

var servingFlag = map[string]string{sdk.BatchIndex: "--continuous-batching", sdk.CompCtxLengths: "--ccl"}

// declareIO declares the graph inputs and outputs window.ModelIO decides.
func (a *assembler) declareIO() error {
	io, err := a.io().Of(a.span)
	if err != nil {
		return err
	}
	for _, v := range io.Inputs {
		a.b.Input(v.Name, v.Type, v.Dims...)
	}
	for _, v := range io.Outputs {
		a.b.Output(v.Name, v.Type, v.Dims...)
	}
	return nil
}

func (a *assembler) io() window.ModelIO {
	return window.ModelIO{Plan: a.parts.plan, Compute: a.compute, Serving: a.serving, ORT: a.ort}
}

// cacheIO is layer i's graph input of cache name and its retained state's
// output (declareIO has checked every cache has them).
func (a *assembler) cacheIO(name string, i int32) (in, out string) {
	in, out, _ = a.io().CacheIO(name, i)
	return in, out
}

// placeContext binds each cache input of the context function to the first
// layer of the span that has that cache: the context only reads its shape.
// A span none of whose layers reads a context value (linear-attention
// layers only) gets no context part.
func (a *assembler) placeContext() error {
	inputs := map[string]string{sdk.PositionIDs: sdk.PositionIDs}
	for _, l := range a.layers() {
		for _, c := range a.kinds[l.GetKind()].GetCaches() {
			if _, ok := inputs[c.GetName()]; !ok {
				inputs[c.GetName()], _ = a.cacheIO(c.GetName(), l.GetIndex())
			}
		}
	}
	if !a.readsContext() {
		return nil
	}
	for _, in := range a.parts.context.GetFunction().GetInput() {
		if _, ok := inputs[in]; !ok && a.isCache(in) {
			return fmt.Errorf("layers %d..%d: the context part reads cache %q, which no layer of the window has; use windows that each hold a layer with it", a.span.First, a.span.Last, in)
		}
	}
	outputs := map[string]string{}
	for _, name := range a.parts.plan.GetContextOutputs() {
		outputs[name] = contextValue(name)
	}
	return a.place(a.parts.context, sdk.NonLayer, "context", keepFormal(inputs, a.parts.context), outputs)
}

// readsContext reports whether a layer of the span declares a context value.
func (a *assembler) readsContext() bool {
	outputs := a.parts.plan.GetContextOutputs()
	for _, l := range a.layers() {
		for _, in := range a.parts.kinds[l.GetKind()].GetFunction().GetInput() {
			if slices.Contains(outputs, in) {
				return true
			}
		}
	}
	return false
}

// isCache reports whether name is a cache of some layer kind.
func (a *assembler) isCache(name string) bool {
	for _, k := range a.kinds {
		for _, c := range k.GetCaches() {
			if c.GetName() == name {
				return true
			}
		}
	}
	return false
}

func (a *assembler) placeLayer(l *pb.Layer, hidden string) (string, error) {
	i := l.GetIndex()
	out := layerPrefix(i) + "/" + sdk.HiddenStatesOut
	if i == a.span.Last && !a.span.IsLast() {
		out = windowHiddenOut
	}
	inputs := map[string]string{sdk.HiddenStates: hidden, sdk.PositionIDs: sdk.PositionIDs}
	outputs := map[string]string{sdk.HiddenStatesOut: out}
	for _, c := range a.kinds[l.GetKind()].GetCaches() {
		inputs[c.GetName()], outputs[c.GetName()+sdk.RetainedSuffix] = a.cacheIO(c.GetName(), i)
	}
	for _, name := range a.parts.plan.GetContextOutputs() {
		inputs[name] = contextValue(name)
	}
	resp := a.parts.kinds[l.GetKind()]
	return out, a.place(resp, i, layerPrefix(i), keepFormal(inputs, resp), outputs)
}

// bind resolves the part's weight bindings for one layer (or sdk.NonLayer)
// into graph values, added to inputs.
// A layer's bindings are let go of once bound: each layer is placed once
// (in one window), and Qwen3-235B-FP8's are 10 MB beside the graph growing.
func (a *assembler) bind(resp *pb.BuildResponse, layer int32, prefix string, inputs map[string]string) error {
	lw, err := layerBindings(resp, layer)
	if err != nil {
		return err
	}
	var prepared []weights.Prepared
	if layer != sdk.NonLayer && a.prepared != nil {
		prepared = <-a.prepared
	}
	for j, wb := range lw.GetBindings() { // validate.go: each a formal input the host does not pass
		var value string
		var err error
		if prepared != nil {
			value, err = a.table.ValueOf(prepared[j], prefix+"/"+wb.GetInput())
		} else {
			value, err = a.table.Value(wb, prefix+"/"+wb.GetInput())
		}
		if err != nil {
			return fmt.Errorf("%s: input %s: %w", prefix, wb.GetInput(), err)
		}
		inputs[wb.GetInput()] = value
	}
	if layer != sdk.NonLayer { // the context part is placed in every window
		lw.Bindings = nil
	}
	return nil
}

// keepFormal drops the role inputs a function does not declare (a layer need
// not take every context value).
func keepFormal(inputs map[string]string, resp *pb.BuildResponse) map[string]string {
	formal := map[string]bool{}
	for _, in := range resp.GetFunction().GetInput() {
		formal[in] = true
	}
	out := map[string]string{}
	for k, v := range inputs {
		if formal[k] {
			out[k] = v
		}
	}
	return out
}

// place binds a part's weights for one layer (or sdk.NonLayer) and inlines
// it, or calls it as a local function when it is a layer and subfunctions
// are on.
func (a *assembler) place(resp *pb.BuildResponse, layer int32, prefix string, inputs, outputs map[string]string) error {
	for _, name := range a.serving.Inputs() {
		if slices.Contains(resp.GetFunction().GetInput(), name) {
			inputs[name] = name
			a.read[name] = true
		}
	}
	for _, x := range a.parts.plan.GetExtraInputs() {
		if slices.Contains(resp.GetFunction().GetInput(), x.GetName()) {
			inputs[x.GetName()] = x.GetName()
		}
	}
	for _, dep := range resp.GetDependencies() {
		if err := a.b.AddFunction(dep); err != nil {
			return err
		}
	}
	if err := a.bind(resp, layer, prefix, inputs); err != nil {
		return err
	}
	call := graph.Call{Fn: resp.GetFunction(), Inputs: inputs, Outputs: outputs, Prefix: prefix}
	if a.subfunctions && layer != sdk.NonLayer {
		return a.b.CallFunction(call)
	}
	return a.b.Inline(call)
}

func layerBindings(resp *pb.BuildResponse, layer int32) (*pb.LayerWeights, error) {
	for _, lw := range resp.GetWeights() {
		if lw.GetLayer() == layer {
			return lw, nil
		}
	}
	if layer == sdk.NonLayer && len(resp.GetWeights()) == 0 {
		return nil, nil
	}
	return nil, fmt.Errorf("plugin built %s without weight bindings for layer %d", resp.GetFunction().GetName(), layer)
}

// digestScratch keeps the buffers bindings are digested in from window to
// window (Kimi-K2's 61 each grew one anew: 11 MB of allocations).
var digestScratch sync.Pool

// prepareLayers prepares the bindings of the span's layers, in order, one
// layer ahead of their placing: on two cores, reading the expressions of
// the next layer's weights overlaps placing this one's. It stops when stop
// is closed, and marks wg done. A layer without bindings is left to bind to
// refuse.
func (a *assembler) prepareLayers(stop <-chan struct{}, wg *sync.WaitGroup) <-chan []weights.Prepared {
	out := make(chan []weights.Prepared, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(out)
		buf, _ := digestScratch.Get().(*[]byte)
		if buf == nil {
			buf = new([]byte)
		}
		scratch := *buf
		defer func() { *buf = scratch[:0]; digestScratch.Put(buf) }()
		for _, l := range a.layers() {
			lw, err := layerBindings(a.parts.kinds[l.GetKind()], l.GetIndex())
			if err != nil {
				return
			}
			ps := make([]weights.Prepared, len(lw.GetBindings()))
			for j, wb := range lw.GetBindings() {
				ps[j], scratch = a.table.Prepare(wb, scratch)
			}
			select {
			case out <- ps:
			case <-stop:
				return
			}
		}
	}()
	return out
}
