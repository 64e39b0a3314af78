package window

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/sdk"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Names at window boundaries. A window after the first takes the hidden
// state as graph input BoundaryIn; one before the last returns it as
// BoundaryOut. Stitched, both become the name a whole export gives the
// last layer's output: Boundary(last).
const (
	BoundaryIn  = sdk.HiddenStates
	BoundaryOut = sdk.HiddenStatesOut
)

// MetadataKey records a window's span in its model's metadata.
const MetadataKey = "strata.window"

// LayerPrefix names the values and nodes of decoder layer i.
func LayerPrefix(i int32) string { return fmt.Sprintf("layers.%d", i) }

// Boundary is the name of layer last's output hidden state.
func Boundary(last int32) string { return LayerPrefix(last) + "/" + sdk.HiddenStatesOut }

// Model is one window's model.
type Model struct {
	Span  Span
	Proto *onnxpb.ModelProto
	// Spec, when set, is the window's weight spec as built (its metadata
	// need not hold it): a window built by this run is not parsed back
	// from JSON.
	Spec *weights.Spec
	// Held, when set, are the window's encoded initializers as built,
	// apart from Proto (graph.Builder.ModelHeld); else Proto holds them.
	Held *graph.Held
}

// Stitch joins window models, in layer order, into the model a whole export
// writes, with the graph inputs and outputs io of the whole model (from
// ModelIO): each window's hidden-state output feeds the next window's
// input under the whole export's name; the context values every window
// computes are kept once; shared weights, casts and functions appear once;
// the weight specs merge, returned rather than put in the model's metadata.
// It takes the models over (their nodes are renamed in place).
func Stitch(ws []Model, io IO) (*onnxpb.ModelProto, *weights.Spec, error) {
	s := NewStitcher(io)
	for _, w := range ws {
		if err := s.Add(w); err != nil {
			return nil, nil, err
		}
	}
	return s.Finish()
}

// Stitcher is Stitch a window at a time: what it keeps of a window is what
// the stitched model holds, so a caller that reads windows one by one
// never holds them all.
type Stitcher struct {
	io       IO
	b        *graph.Builder
	produced map[string]*onnxpb.NodeProto      // value -> node that computes it
	inputs   map[string]*onnxpb.ValueInfoProto // the stitched model's graph inputs
	inits    map[string]*onnxpb.TensorProto    // initializers so far, but those referencing the checkpoint
	// referenced are the initializers that reference checkpoint tensors,
	// by name: their encodings in the stitched model (graph.Builder keeps
	// them encoded), which a later window's must equal.
	// Each is kept as a hash of its encoding (88,000 slices were 2 MB),
	// under a 128-bit hash of its name: a map without pointers, which no
	// garbage collection scans (Kimi-K2's 139,000 names were 7 MB of the
	// live heap of every collection while windows were stitched). Two
	// names of one hash would be refused as differing, never merged.
	referenced map[nameHash]uint64
	seed       maphash.Seed
	nameSeeds  [2]maphash.Seed
	// From the windows' models: the first's producer, their metadata, specs.
	producer, producerVersion string
	props                     map[string]string
	specs                     weights.Merger
	last                      *Span // the window added last
	spill                     *graph.Spill
}

// NewStitcher starts a stitched model with the whole model's io.
func NewStitcher(io IO) *Stitcher {
	s := &Stitcher{io: io, produced: map[string]*onnxpb.NodeProto{}, inputs: map[string]*onnxpb.ValueInfoProto{},
		inits: map[string]*onnxpb.TensorProto{}, referenced: map[nameHash]uint64{}, seed: maphash.MakeSeed(), props: map[string]string{},
		nameSeeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
	for _, v := range io.Inputs {
		s.inputs[v.Name] = v.Info()
	}
	return s
}

// Add joins the next window, which must start where the last one ended.
func (s *Stitcher) Add(w Model) error {
	next := int32(0)
	if s.last != nil {
		next = s.last.Last + 1
	}
	if w.Span.First != next || w.Span.Last < w.Span.First {
		return fmt.Errorf("windows do not tile the layers: window %s follows layer %d", w.Span, next-1)
	}
	if s.b == nil {
		s.b = graph.New(w.Proto.GetGraph().GetName())
		if s.spill != nil {
			s.b.SpillTo(s.spill)
		}
		s.producer, s.producerVersion = w.Proto.GetProducerName(), w.Proto.GetProducerVersion()
	}
	if err := s.add(w); err != nil {
		return fmt.Errorf("window %s: %w", w.Span, err)
	}
	if err := s.keepMetadata(w); err != nil {
		return fmt.Errorf("window %s: %w", w.Span, err)
	}
	s.last = &w.Span
	return nil
}

// Finish checks the windows covered every layer and returns the stitched
// model and the merged weight spec.
func (s *Stitcher) Finish() (*onnxpb.ModelProto, *weights.Spec, error) {
	m, held, spec, err := s.FinishHeld()
	if err != nil {
		return nil, nil, err
	}
	if _, err := graph.Hold(m, held); err != nil {
		return nil, nil, err
	}
	return m, spec, nil
}

// FinishHeld is Finish with the checkpoint tensors' initializers apart from
// the model, as graph.Builder.ModelHeld gives them (for graph.WriteModel).
func (s *Stitcher) FinishHeld() (*onnxpb.ModelProto, graph.Held, *weights.Spec, error) {
	switch {
	case s.last == nil:
		return nil, graph.Held{}, nil, fmt.Errorf("no windows to stitch")
	case s.last.Last != s.last.Count-1:
		return nil, graph.Held{}, nil, fmt.Errorf("windows end at layer %d of %d", s.last.Last, s.last.Count)
	}
	for _, v := range s.io.Inputs {
		s.b.InputInfo(v.Info())
	}
	for _, v := range s.io.Outputs {
		s.b.OutputInfo(v.Info())
	}
	spec, err := s.specs.Spec()
	if err != nil {
		return nil, graph.Held{}, nil, err
	}
	// No spec in the metadata: the caller writes it beside the model and
	// records where (a 9 MB value encoded only to be replaced).
	model, held := s.b.ModelHeld(graph.Metadata{ProducerName: s.producer, ProducerVersion: s.producerVersion, Props: s.props})
	return model, held, spec, nil
}

// keepMetadata takes the window's spec (as built, or parsed from its
// metadata) and checks its other metadata agrees with the earlier windows'.
func (s *Stitcher) keepMetadata(w Model) error {
	if w.Spec != nil {
		if err := s.specs.Add(w.Spec); err != nil {
			return err
		}
	}
	for _, p := range w.Proto.GetMetadataProps() {
		switch p.GetKey() {
		case MetadataKey:
		case weights.MetadataKey:
			if w.Spec == nil {
				spec, err := weights.ParseSpec([]byte(p.GetValue()))
				if err != nil {
					return err
				}
				if err := s.specs.Add(spec); err != nil {
					return err
				}
			}
		default:
			if prev, ok := s.props[p.GetKey()]; ok && prev != p.GetValue() {
				return fmt.Errorf("windows disagree on %s (%q, %q): they come from different exports", p.GetKey(), prev, p.GetValue())
			}
			s.props[p.GetKey()] = p.GetValue()
		}
	}
	return nil
}

func (s *Stitcher) add(w Model) error {
	g := w.Proto.GetGraph()
	rename := map[string]string{}
	if !w.Span.IsFirst() {
		rename[BoundaryIn] = Boundary(w.Span.First - 1)
		rename[ExtraOutputName(w.Span, BoundaryIn)] = BoundaryIn // an extra output of that name (ExtraOutputName)
	}
	if !w.Span.IsLast() {
		rename[BoundaryOut] = Boundary(w.Span.Last)
	}
	for _, op := range w.Proto.GetOpsetImport() {
		if err := s.b.Import(op.GetDomain(), op.GetVersion()); err != nil {
			return err
		}
	}
	for _, fn := range w.Proto.GetFunctions() {
		if err := s.b.AddFunction(fn); err != nil {
			return err
		}
	}
	if err := s.addInitializers(g); err != nil {
		return err
	}
	encoded := graph.EncodedReferenced(w.Proto, s.addEncoded)
	if w.Held != nil && encoded == nil {
		if encoded = graph.EachEncoded(*w.Held, s.addEncoded); encoded == nil {
			w.Held.Recycle() // copied: the next windows reuse its chunks
		}
	}
	if encoded != nil {
		return encoded
	}
	for _, n := range g.GetNode() {
		if err := s.addNode(renamed(n, rename)); err != nil {
			return err
		}
	}
	return nil
}

// addInitializers adds each initializer once. Two windows may both hold a
// shared weight (a tied embedding): referenced, the two are equal;
// materialised, each window wrote its own copy, and the first serves both.
func (s *Stitcher) addInitializers(g *onnxpb.GraphProto) error {
	for _, t := range g.GetInitializer() {
		if referencesCheckpoint(t) {
			if err := s.addReferenced(t); err != nil {
				return err
			}
			continue
		}
		if prev, ok := s.inits[t.GetName()]; ok {
			if !proto.Equal(prev, t) && !sameTensorType(prev, t) {
				return fmt.Errorf("initializer %s differs from an earlier window's", t.GetName())
			}
			continue
		}
		s.inits[t.GetName()] = t
		s.b.Initializer(t)
	}
	return nil
}

// addReferenced adds a checkpoint tensor's initializer once, encoded; one
// an earlier window added must be the same.
// It encodes t into the stitched model first (no copy), and takes it back
// when an earlier window added it.
func (s *Stitcher) addReferenced(t *onnxpb.TensorProto) error {
	raw, err := s.b.Referenced(t)
	if err != nil {
		return err
	}
	key := s.nameHashString(t.GetName())
	if prev, seen := s.referenced[key]; seen {
		s.b.Unreference(raw)
		return s.sameReferenced(t.GetName(), prev, raw)
	}
	s.referenced[key] = maphash.Bytes(s.seed, raw)
	return nil
}

// addEncoded is addReferenced for an initializer a window built in this
// process holds encoded (graph.Builder.Referenced): no TensorProto at all.
func (s *Stitcher) addEncoded(name, raw []byte) error {
	key := s.nameHash(name)
	if prev, seen := s.referenced[key]; seen {
		return s.sameReferenced(string(name), prev, raw)
	}
	s.referenced[key] = maphash.Bytes(s.seed, s.b.ReferencedEncoded(raw))
	return nil
}

// nameHash keys an initializer's name in Stitcher.referenced.
type nameHash [2]uint64

func (s *Stitcher) nameHash(name []byte) nameHash {
	return nameHash{maphash.Bytes(s.nameSeeds[0], name), maphash.Bytes(s.nameSeeds[1], name)}
}

// nameHashString is nameHash of a string (maphash hashes the two alike).
func (s *Stitcher) nameHashString(name string) nameHash {
	return nameHash{maphash.String(s.nameSeeds[0], name), maphash.String(s.nameSeeds[1], name)}
}

// Reserve sizes the stitcher for about n initializers referencing the
// checkpoint (its tensors): grown instead, their index was 13 MB of
// Kimi-K2's allocations.
func (s *Stitcher) Reserve(n int) {
	if len(s.referenced) == 0 {
		s.referenced = make(map[nameHash]uint64, n)
	}
}

// SpillTo makes the stitched model's builder spill its encoded
// initializers to sp (graph.Builder.SpillTo).
func (s *Stitcher) SpillTo(sp *graph.Spill) { s.spill = sp }

func (s *Stitcher) sameReferenced(name string, prev uint64, raw []byte) error {
	if prev != maphash.Bytes(s.seed, raw) {
		return fmt.Errorf("initializer %s differs from an earlier window's", name)
	}
	return nil
}

// referencesCheckpoint reports whether t is external data in the export's
// checkpoint/ links (not materialised weights, which --weight-spec qaic
// turns into graph inputs).
func referencesCheckpoint(t *onnxpb.TensorProto) bool {
	if t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
		return false
	}
	for _, e := range t.GetExternalData() {
		if e.GetKey() == "location" {
			return strings.HasPrefix(e.GetValue(), weights.DataDir+"/")
		}
	}
	return false
}

func sameTensorType(a, b *onnxpb.TensorProto) bool {
	return a.GetDataType() == b.GetDataType() && slices.Equal(a.GetDims(), b.GetDims()) &&
		a.GetDataLocation() == onnxpb.TensorProto_EXTERNAL && b.GetDataLocation() == onnxpb.TensorProto_EXTERNAL
}

// renamed renames n's inputs and outputs in place (the window is the
// stitcher's: a copy of every node was a third of the stitching).
func renamed(n *onnxpb.NodeProto, rename map[string]string) *onnxpb.NodeProto {
	for i, v := range n.Input {
		if r, ok := rename[v]; ok {
			n.Input[i] = r
		}
	}
	for i, v := range n.Output {
		if r, ok := rename[v]; ok {
			n.Output[i] = r
		}
	}
	return n
}

// addNode adds n unless an earlier window already computes its outputs the
// same way (the context every window recomputes, casts of shared weights).
func (s *Stitcher) addNode(n *onnxpb.NodeProto) error {
	seen := 0
	for _, out := range n.GetOutput() {
		if _, ok := s.produced[out]; ok {
			seen++
		}
	}
	switch {
	case seen == 0:
		for _, out := range n.GetOutput() {
			s.produced[out] = n
		}
		s.b.Node(n)
		return nil
	case seen == len(n.GetOutput()) && s.equivalent(s.produced[n.GetOutput()[0]], n):
		return nil
	default:
		return fmt.Errorf("node %s computes %v differently from an earlier window", n.GetName(), n.GetOutput())
	}
}

// equivalent reports whether b computes what a does. The one difference
// allowed: a Shape may read another graph input of the same declared type
// (each window's context reads the shape of its own first cache).
func (s *Stitcher) equivalent(a, b *onnxpb.NodeProto) bool {
	if a.GetOpType() == "Shape" && a.GetDomain() == "" && len(a.GetInput()) == 1 && len(b.GetInput()) == 1 {
		x, y := s.inputs[a.GetInput()[0]], s.inputs[b.GetInput()[0]]
		if x != nil && y != nil && proto.Equal(x.GetType(), y.GetType()) {
			b = proto.Clone(b).(*onnxpb.NodeProto)
			b.Input[0] = a.GetInput()[0]
		}
	}
	return proto.Equal(a, b)
}

// finish merges the windows' metadata: all must agree but on their span
// and weight spec.
