// Package compile drives compilers over a strata export: qaic-compile,
// exactly as the Qualcomm toolchain invokes it (specializations, custom IO,
// multi-device partitions, the flag mapping), and ONNX Runtime's own graph
// optimiser.
package compile

import (
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Model is what compiling needs to know of an exported model, read from its
// graph (the file is small: weights are external).
type Model struct {
	Path string
	// Caches are the state inputs paired with a <name>_RetainedState output,
	// in input order.
	Caches             []string
	CacheType          onnxpb.TensorProto_DataType
	ContinuousBatching bool // has a batch_index input
	CCL                bool // has a comp_ctx_lengths input
	// LayerFunctions: decoder layers are calls of local functions (an export
	// made with --subfunctions).
	LayerFunctions bool
	Nodes          int
}

// ReadProto reads an ONNX model file (a regular file only: a FIFO or a
// device would block or never end).
func ReadProto(path string) (*onnxpb.ModelProto, error) {
	// A model is a regular file: a FIFO or a device would block or never end.
	f, info, err := checkpoint.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data := make([]byte, info.Size())
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var m onnxpb.ModelProto
	if err := proto.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: not an ONNX model: %w", path, err)
	}
	return &m, nil
}

// CountNodes counts a model's top-level nodes.
func CountNodes(path string) (int, error) {
	m, err := ReadProto(path)
	if err != nil {
		return 0, err
	}
	return len(m.GetGraph().GetNode()), nil
}

// ReadModel reads an export's model file.
func ReadModel(path string) (*Model, error) {
	m, err := ReadProto(path)
	if err != nil {
		return nil, err
	}
	g := m.GetGraph()
	info := &Model{Path: path, Nodes: len(g.GetNode())}
	outputs := map[string]bool{}
	for _, o := range g.GetOutput() {
		outputs[o.GetName()] = true
	}
	for _, in := range g.GetInput() {
		switch name := in.GetName(); {
		case outputs[name+sdk.RetainedSuffix]:
			info.Caches = append(info.Caches, name)
			info.CacheType = onnxpb.TensorProto_DataType(in.GetType().GetTensorType().GetElemType())
		case name == sdk.BatchIndex:
			info.ContinuousBatching = true
		case name == sdk.CompCtxLengths:
			info.CCL = true
		}
	}
	if len(info.Caches) == 0 {
		return nil, fmt.Errorf("%s has no KV-cache inputs with _RetainedState outputs: not a strata causal-LM export", path)
	}
	for _, fn := range m.GetFunctions() {
		if fn.GetDomain() != blocks.QualcommDomain && fn.GetDomain() != blocks.QTIDomain && strings.HasPrefix(fn.GetDomain(), "strata.") {
			info.LayerFunctions = true
		}
	}
	return info, nil
}
