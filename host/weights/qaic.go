package weights

import (
	"encoding/json"
	"fmt"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// The reference toolchain's weight-free format (QEfficient's weight_spec
// version 5), for exports with materialised weights.
const (
	QAICSpec        = "qaic"
	QAICMetadataKey = "com.qti.aisw.extdata"
	QAICVersion     = 5
	QAICSpecFile    = "weight_spec_qaic.json"
)

// Field order is alphabetical: the format is written with sorted keys.
type qaicSpec struct {
	Files     []qaicFile  `json:"files"`
	Inputs    []qaicInput `json:"inputs"`
	ModelID   string      `json:"model_id"`
	ModelName string      `json:"model_name"`
	Version   int         `json:"version"`
}

type qaicFile struct {
	Format string `json:"format"`
	Path   string `json:"path"`
}

type qaicInput struct {
	Location qaicLocation `json:"location"`
	Name     string       `json:"name"`
}

type qaicLocation struct {
	File int    `json:"file"`
	Key  string `json:"key"`
}

// QAIC turns a model whose weights were materialised into the reference
// toolchain's weight-free form: every weight initializer becomes a graph
// input of the same name, type and shape, and a version-5 spec maps each to
// (file, key) in the materialised safetensors files, paths relative to the
// export directory (its parent of the weights directory, the format's
// checkpoint root). The spec is embedded under com.qti.aisw.extdata and
// returned for weight_spec_qaic.json.
func QAIC(m *onnxpb.ModelProto, spec *Spec, modelName, exportDir string) ([]byte, error) {
	if spec.Mode != Materialize {
		return nil, fmt.Errorf("the %s weight spec needs --weights materialize: version 5 maps weights to safetensors keys and has no transforms", QAICSpec)
	}
	// QEfficient writes an absolute model_id; strata writes no path of the
	// machine into an output: it is the weights directory relative to the
	// export directory, the root files[].path are relative to as well.
	_ = exportDir
	q := qaicSpec{ModelID: "weights", ModelName: modelName, Version: QAICVersion}
	index := map[int]int{} // spec file -> qaic file
	for _, w := range spec.Weights {
		f := w.Data.File
		if _, ok := index[f]; !ok {
			index[f] = len(q.Files)
			q.Files = append(q.Files, qaicFile{Format: "safetensors", Path: spec.Files[f].Path})
		}
		q.Inputs = append(q.Inputs, qaicInput{Location: qaicLocation{File: index[f], Key: w.Name}, Name: w.Name})
	}
	compact, err := json.Marshal(q)
	if err != nil {
		return nil, err
	}
	weightsToInputs(m.GetGraph())
	m.MetadataProps = append(m.MetadataProps, &onnxpb.StringStringEntryProto{Key: QAICMetadataKey, Value: string(compact)})
	pretty, err := json.MarshalIndent(q, "", "  ")
	return append(pretty, '\n'), err
}

// weightsToInputs moves the external initializers to graph inputs.
func weightsToInputs(g *onnxpb.GraphProto) {
	var kept []*onnxpb.TensorProto
	for _, t := range g.GetInitializer() {
		if t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
			kept = append(kept, t)
			continue
		}
		shape := &onnxpb.TensorShapeProto{}
		for _, d := range t.GetDims() {
			shape.Dim = append(shape.Dim, &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
		}
		g.Input = append(g.Input, &onnxpb.ValueInfoProto{Name: t.GetName(), Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
			TensorType: &onnxpb.TypeProto_Tensor{ElemType: t.GetDataType(), Shape: shape}}}})
	}
	g.Initializer = kept
}
