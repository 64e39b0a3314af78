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
	// ORT: onnxruntime-genai's decoder IO (--target ort): no position_ids,
	// the KV cache as past_key_values.{i}.key/value in and present.{i}.*
	// out (CacheIO), logits at every position unless the plan's
	// OrtDecoder.last_token_logits (--logits last).
	ORT bool
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
	if m.ORT {
		seq.Param = "sequence_length"
	}
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
	if !m.ORT {
		io.Inputs = append(io.Inputs, Value{sdk.PositionIDs, onnxpb.TensorProto_INT64, pos})
	}
	if io.Inputs, err = m.extraInputs(io.Inputs); err != nil {
		return IO{}, err
	}
	caches, err := m.caches(s)
	if err != nil {
		return IO{}, err
	}
	for _, c := range caches {
		io.Inputs = append(io.Inputs, c.in)
	}
	if m.Serving.CCL {
		io.Inputs = append(io.Inputs, Value{sdk.CompCtxLengths, onnxpb.TensorProto_INT64, []graph.Dim{{Param: "comp_ctx_lengths"}}})
	}
	if m.Serving.ContinuousBatching {
		io.Inputs = append(io.Inputs, Value{sdk.BatchIndex, onnxpb.TensorProto_INT64, []graph.Dim{batch, {Size: 1}}})
	}
	if s.IsLast() {
		rows := graph.Dim{Size: 1} // the last valid token's
		if m.ORT && !m.Plan.GetOrtDecoder().GetLastTokenLogits() {
			rows = seq
		}
		io.Outputs = append(io.Outputs, Value{sdk.Logits, onnxpb.TensorProto_FLOAT, []graph.Dim{batch, rows, {Size: m.Plan.GetVocabSize()}}})
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
		io.Outputs = append(io.Outputs, c.out)
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

// cacheIO is one cache's graph input and the output of its retained state.
type cacheIO struct{ in, out Value }

// caches are the caches of the span's layers, in layer order.
func (m ModelIO) caches(s Span) ([]cacheIO, error) {
	kinds := map[string]*pb.LayerKind{}
	for _, k := range m.Plan.GetKinds() {
		kinds[k.GetName()] = k
	}
	var out []cacheIO
	for _, l := range m.Plan.GetLayers()[s.First : s.Last+1] {
		for _, c := range kinds[l.GetKind()].GetCaches() {
			in, retained, err := m.CacheIO(c.GetName(), l.GetIndex())
			if err != nil {
				return nil, err
			}
			d := dims(c.GetShape())
			outDims := d
			if m.ORT { // present holds the past and the new tokens
				outDims = slices.Clone(d)
				for i := range outDims {
					if outDims[i].Param == ORTPastLength {
						outDims[i].Param = ORTTotalLength
					}
				}
			}
			out = append(out, cacheIO{Value{in, m.Compute, d}, Value{retained, m.Compute, outDims}})
		}
	}
	return out, nil
}

// CacheName is layer i's cache input: past_key.3.
func CacheName(name string, i int32) string { return fmt.Sprintf("%s.%d", name, i) }

// The KV cache's dimension names in onnxruntime-genai's decoder IO.
const (
	ORTPastLength  = "past_sequence_length"
	ORTTotalLength = "total_sequence_length"
)

// ORT names of the KV cache, onnxruntime-genai's (with the layer index).
const (
	ORTPastKey      = "past_key_values.%d.key"
	ORTPastValue    = "past_key_values.%d.value"
	ORTPresentKey   = "present.%d.key"
	ORTPresentValue = "present.%d.value"
)

// CacheIO is layer i's graph input of cache name and the graph output of
// its retained state: past_key.3 and past_key.3_RetainedState, or in
// onnxruntime-genai's IO past_key_values.3.key and present.3.key (only
// the KV cache has names there).
func (m ModelIO) CacheIO(name string, i int32) (in, out string, err error) {
	if !m.ORT {
		return CacheName(name, i), CacheName(name, i) + sdk.RetainedSuffix, nil
	}
	switch name {
	case "past_key":
		return fmt.Sprintf(ORTPastKey, i), fmt.Sprintf(ORTPresentKey, i), nil
	case "past_value":
		return fmt.Sprintf(ORTPastValue, i), fmt.Sprintf(ORTPresentValue, i), nil
	}
	return "", "", fmt.Errorf("layer %d has cache %q, which onnxruntime-genai's decoder IO has no name for (--target ort maps past_key and past_value only)", i, name)
}

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
