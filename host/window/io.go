package window

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// The one place that decides a model's graph inputs and outputs and their
// order, for the whole model and for every window: the whole export, each
// window's export and the stitcher all take them from here.

// Serving is which serving-mode inputs a model has.
type Serving struct{ ContinuousBatching, CCL bool }

// Inputs are the serving inputs, by name, in graph order.
func (s Serving) Inputs() []string {
	var out []string
	if s.CCL {
		out = append(out, sdk.CompCtxLengths)
	}
	if s.ContinuousBatching {
		out = append(out, sdk.BatchIndex)
	}
	return out
}

// Value is one graph input or output.
type Value struct {
	Name string
	Type onnxpb.TensorProto_DataType
	Dims []graph.Dim
}

// Info is the value as the graph declares it.
func (v Value) Info() *onnxpb.ValueInfoProto {
	return &onnxpb.ValueInfoProto{Name: v.Name, Type: graph.TensorType(v.Type, v.Dims)}
}

// IO is a model's graph inputs and outputs, in order.
type IO struct {
	Inputs, Outputs []Value
}

// ModelIO describes the models one plan makes.
type ModelIO struct {
	Plan    *pb.PlanResponse
	Compute dtype.DType
	Serving Serving
}

// Of is the IO of the window s (Whole for the whole model). Inputs: the
// tokens (input_ids, inputs_embeds, or after the first window the hidden
// state), position_ids, the plan's extra inputs (those not already there),
// each layer's caches, comp_ctx_lengths, batch_index.
// Outputs: logits and the plan's extra outputs (or before the last window
// the hidden state), then each cache's retained state.
func (m ModelIO) Of(s Span) (IO, error) {
	var io IO
	batch, seq := graph.Dim{Param: "batch_size"}, graph.Dim{Param: "seq_len"}
	hidden := []graph.Dim{batch, seq, {Size: m.Plan.GetHiddenSize()}}
	switch {
	case !s.IsFirst():
		io.Inputs = append(io.Inputs, Value{BoundaryIn, m.Compute, hidden})
	case m.Plan.GetInputsEmbeds():
		io.Inputs = append(io.Inputs, Value{sdk.InputsEmbeds, m.Compute, hidden})
	default:
		io.Inputs = append(io.Inputs, Value{sdk.InputIDs, onnxpb.TensorProto_INT64, []graph.Dim{batch, seq}})
	}
	pos, err := m.positionDims(batch, seq)
	if err != nil {
		return IO{}, err
	}
	io.Inputs = append(io.Inputs, Value{sdk.PositionIDs, onnxpb.TensorProto_INT64, pos})
	if io.Inputs, err = m.extraInputs(io.Inputs); err != nil {
		return IO{}, err
	}
	caches := m.caches(s)
	for _, c := range caches {
		io.Inputs = append(io.Inputs, c)
	}
	if m.Serving.CCL {
		io.Inputs = append(io.Inputs, Value{sdk.CompCtxLengths, onnxpb.TensorProto_INT64, []graph.Dim{{Param: "comp_ctx_lengths"}}})
	}
	if m.Serving.ContinuousBatching {
		io.Inputs = append(io.Inputs, Value{sdk.BatchIndex, onnxpb.TensorProto_INT64, []graph.Dim{batch, {Size: 1}}})
	}
	if s.IsLast() {
		io.Outputs = append(io.Outputs, Value{sdk.Logits, onnxpb.TensorProto_FLOAT, []graph.Dim{batch, {Size: 1}, {Size: m.Plan.GetVocabSize()}}})
		for _, x := range m.Plan.GetExtraOutputs() {
			v, err := SpecValue(x, m.Compute)
			if err != nil {
				return IO{}, fmt.Errorf("extra output: %w", err)
			}
			v.Name = ExtraOutputName(s, v.Name)
			io.Outputs = append(io.Outputs, v)
		}
	} else {
		io.Outputs = append(io.Outputs, Value{BoundaryOut, m.Compute, hidden})
	}
	for _, c := range caches {
		c.Name += sdk.RetainedSuffix
		io.Outputs = append(io.Outputs, c)
	}
	return io, nil
}

// positionDims is position_ids' shape: [batch, seq], or [rows, batch, seq]
// for rank 3 (3 rows unless the plan says 4).
func (m ModelIO) positionDims(batch, seq graph.Dim) ([]graph.Dim, error) {
	switch m.Plan.GetPositionIdsRank() {
	case 0, 2:
		return []graph.Dim{batch, seq}, nil
	case 3:
	default:
		return nil, fmt.Errorf("the plan asks for position_ids of rank %d; strata knows ranks 2 and 3", m.Plan.GetPositionIdsRank())
	}
	switch rows := m.Plan.GetPositionRows(); rows {
	case 0, 3, 4:
		return []graph.Dim{{Size: max(int64(rows), 3)}, batch, seq}, nil
	default:
		return nil, fmt.Errorf("the plan asks for position_ids of %d rows; strata knows 3 and 4", rows)
	}
}

// extraInputs appends the plan's extra inputs that are not inputs already
// (input_ids is one in the first window, an extra one after it).
func (m ModelIO) extraInputs(inputs []Value) ([]Value, error) {
	for _, x := range m.Plan.GetExtraInputs() {
		v, err := SpecValue(x, m.Compute)
		if err != nil {
			return nil, fmt.Errorf("extra input: %w", err)
		}
		i := slices.IndexFunc(inputs, func(in Value) bool { return in.Name == v.Name })
		switch {
		case i < 0:
			inputs = append(inputs, v)
		case inputs[i].Type != v.Type || !slices.Equal(inputs[i].Dims, v.Dims):
			return nil, fmt.Errorf("extra input %s: the plan declares it unlike the model's own input of that name", v.Name)
		}
	}
	return inputs, nil
}

// FinalSuffix marks, in a window after the first, an extra output named
// like the window's hidden-state input (an MTP draft's hidden_states).
const FinalSuffix = "_final"

// ExtraOutputName is the graph name of the plan's extra output name in
// window s: its own, except where it would clash with the hidden-state
// input of a window after the first; there it is name+FinalSuffix, renamed
// back when the windows are stitched.
func ExtraOutputName(s Span, name string) string {
	if !s.IsFirst() && name == BoundaryIn {
		return name + FinalSuffix
	}
	return name
}

// caches are the cache inputs of the span's layers, in layer order.
func (m ModelIO) caches(s Span) []Value {
	kinds := map[string]*pb.LayerKind{}
	for _, k := range m.Plan.GetKinds() {
		kinds[k.GetName()] = k
	}
	var out []Value
	for _, l := range m.Plan.GetLayers()[s.First : s.Last+1] {
		for _, c := range kinds[l.GetKind()].GetCaches() {
			out = append(out, Value{CacheName(c.GetName(), l.GetIndex()), m.Compute, dims(c.GetShape())})
		}
	}
	return out
}

// CacheName is layer i's cache input: past_key.3.
func CacheName(name string, i int32) string { return fmt.Sprintf("%s.%d", name, i) }

func dims(ds []*pb.Dim) []graph.Dim {
	out := make([]graph.Dim, len(ds))
	for i, d := range ds {
		out[i] = graph.Dim{Size: d.GetSize(), Param: d.GetParam()}
	}
	return out
}

// SpecValue is a plugin's IOSpec as a graph value: dtype "compute" (or
// empty) is the export's compute dtype.
func SpecValue(s *pb.IOSpec, compute dtype.DType) (Value, error) {
	t := compute
	if s.GetDtype() != "" && s.GetDtype() != "compute" {
		var err error
		if t, err = dtype.Parse(s.GetDtype()); err != nil {
			return Value{}, fmt.Errorf("%s: %w", s.GetName(), err)
		}
	}
	if s.GetName() == "" {
		return Value{}, fmt.Errorf("a graph value without a name")
	}
	return Value{s.GetName(), t, dims(s.GetShape())}, nil
}
