// Command transformcases writes weight-transform test cases for the
// conformance suite: per case, the source tensors (a safetensors file), an
// ONNX model whose only output is the in-graph lowering of the transform,
// and the bytes the Go lowering computes. ONNX Runtime then checks both
// lowerings give the same bits.
//
//	transformcases --out DIR [--count N] [--seed S]   random cases
//	transformcases --out DIR --fixture FIXTURE_DIR    cases recorded by transformers
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/graph"
	"github.com/strata-llm/strata/host/weights/transform"
	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

func main() {
	out := flag.String("out", "", "directory to write the cases into")
	count := flag.Int("count", 200, "random cases")
	seed := flag.Uint64("seed", 1, "random seed")
	fixture := flag.String("fixture", "", "write the cases of a transformers fixture (cases.json + inputs.safetensors) instead")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "transformcases: --out is required")
		os.Exit(2)
	}
	var err error
	if *fixture != "" {
		err = writeFixtureCases(*out, *fixture)
	} else {
		err = writeRandomCases(*out, *count, rand.New(rand.NewPCG(*seed, 0)))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "transformcases:", err)
		os.Exit(1)
	}
}

// caseInfo is one line of cases.json: what the test reads.
type caseInfo struct {
	Name     string  `json:"name"`
	Expr     string  `json:"expr"`
	DType    string  `json:"dtype"`
	Shape    []int64 `json:"shape"`
	Expected string  `json:"expected"` // file of expected bytes, relative to the case directory
}

// writeCase lowers e two ways: model.onnx (in-graph, over src) and, unless
// expected is given, expected.bin (Go).
func writeCase(dir, name, src string, e *transform.Expr, expected []byte) (caseInfo, error) {
	ckpt, err := checkpoint.OpenFile(src)
	if err != nil {
		return caseInfo{}, err
	}
	lookup := func(key string) (transform.Type, error) {
		t, ok := ckpt.Tensor(key)
		if !ok {
			return transform.Type{}, fmt.Errorf("no tensor %s", key)
		}
		info, _ := dtype.FromSafetensors(t.DType)
		return transform.Type{DType: info.ONNX, Shape: t.Shape}, nil
	}
	if err := e.Infer(lookup); err != nil {
		return caseInfo{}, err
	}
	if expected == nil {
		got, err := e.Eval(ckpt.ReadTensor)
		if err != nil {
			return caseInfo{}, err
		}
		expected = got.Bytes
	}
	caseDir := filepath.Join(dir, name)
	if err := os.MkdirAll(caseDir, 0o755); err != nil {
		return caseInfo{}, err
	}
	if err := copyFile(src, filepath.Join(caseDir, "source.safetensors")); err != nil {
		return caseInfo{}, err
	}
	model, err := lowerModel(ckpt, e)
	if err != nil {
		return caseInfo{}, err
	}
	if err := os.WriteFile(filepath.Join(caseDir, "model.onnx"), model, 0o644); err != nil {
		return caseInfo{}, err
	}
	if err := os.WriteFile(filepath.Join(caseDir, "expected.bin"), expected, 0o644); err != nil {
		return caseInfo{}, err
	}
	return caseInfo{Name: name, Expr: e.String(), DType: dtype.Name(e.Type.DType), Shape: e.Type.Shape, Expected: "expected.bin"}, nil
}

// caseGraph is a transform.Graph over one safetensors file next to the model.
type caseGraph struct {
	b     *graph.Builder
	ckpt  *checkpoint.Checkpoint
	n     int
	added map[string]bool
}

func (g *caseGraph) Leaf(key string, _ *checkpoint.Tensor) (string, error) {
	t, _ := g.ckpt.Tensor(key)
	if !g.added[key] {
		g.added[key] = true
		info, _ := dtype.FromSafetensors(t.DType)
		g.b.Initializer(&onnxpb.TensorProto{
			Name: key, DataType: int32(transform.GraphType(info.ONNX)), Dims: t.Shape, DataLocation: onnxpb.TensorProto_EXTERNAL,
			ExternalData: []*onnxpb.StringStringEntryProto{
				{Key: "location", Value: "source.safetensors"},
				{Key: "offset", Value: fmt.Sprint(t.Offset)},
				{Key: "length", Value: fmt.Sprint(t.Length)},
			},
		})
	}
	return key, nil
}

func (g *caseGraph) Bytes(key string, shape []int64) (string, error) {
	t, _ := g.ckpt.Tensor(key)
	name := key + "::bytes"
	if !g.added[name] {
		g.added[name] = true
		g.b.Initializer(&onnxpb.TensorProto{
			Name: name, DataType: int32(onnxpb.TensorProto_UINT8), Dims: shape, DataLocation: onnxpb.TensorProto_EXTERNAL,
			ExternalData: []*onnxpb.StringStringEntryProto{
				{Key: "location", Value: "source.safetensors"},
				{Key: "offset", Value: fmt.Sprint(t.Offset)},
				{Key: "length", Value: fmt.Sprint(t.Length)},
			},
		})
	}
	return name, nil
}

func (g *caseGraph) Node(op string, inputs []string, attrs ...*onnxpb.AttributeProto) string {
	g.n++
	out := fmt.Sprintf("%s_%d", op, g.n)
	g.b.Node(&onnxpb.NodeProto{Name: out, OpType: op, Input: inputs, Output: []string{out}, Attribute: attrs})
	return out
}

func lowerModel(ckpt *checkpoint.Checkpoint, e *transform.Expr) ([]byte, error) {
	b := graph.New("transform")
	if err := b.Import("", 17); err != nil {
		return nil, err
	}
	g := &caseGraph{b: b, ckpt: ckpt, added: map[string]bool{}}
	out, err := e.Lower(g)
	if err != nil {
		return nil, err
	}
	const result = "result"
	b.Node(&onnxpb.NodeProto{Name: result, OpType: "Identity", Input: []string{out}, Output: []string{result}})
	dims := make([]graph.Dim, len(e.Type.Shape))
	for i, d := range e.Type.Shape {
		dims[i] = graph.Dim{Size: d}
	}
	b.Output(result, transform.GraphType(e.Type.DType), dims...)
	return proto.MarshalOptions{Deterministic: true}.Marshal(b.Model(graph.Metadata{ProducerName: "transformcases"}))
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

func writeIndex(dir string, cases []caseInfo) error {
	data, err := json.MarshalIndent(cases, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "cases.json"), data, 0o644)
}
