// Package weights turns the weight bindings of a plan into ONNX initializers
// that reference the checkpoint's own bytes, links the shards they live in
// into the output directory, and writes weight_spec.json.
package weights

import (
	"encoding/json"
	"fmt"
)

// Spec is weight_spec.json: every weight the graph uses and where its bytes
// are. Documented in docs/weight-spec.md; the same JSON is embedded in the
// model's metadata under MetadataKey.
type Spec struct {
	Format       string   `json:"format"`
	Version      int      `json:"version"`
	Producer     Producer `json:"producer"`
	ModelType    string   `json:"model_type"`
	ComputeDType string   `json:"compute_dtype"`
	// Checkpoint is the absolute path of the source checkpoint directory.
	Checkpoint string   `json:"checkpoint"`
	Files      []File   `json:"files"`
	Weights    []Weight `json:"weights"`
}

// Format, version and metadata key of our weight spec.
const (
	SpecFormat  = "strata.weight_spec"
	SpecVersion = 1
	MetadataKey = "strata.weight_spec"
)

// Producer names what wrote the spec.
type Producer struct {
	Strata        string `json:"strata"`
	Plugin        string `json:"plugin"`
	PluginVersion string `json:"plugin_version"`
}

// File is one checkpoint shard the graph reads.
type File struct {
	// Path is where the model finds the shard, relative to the model file.
	Path string `json:"path"`
	// Source is the shard's name in the checkpoint directory.
	Source string `json:"source"`
	Size   int64  `json:"size"`
	// Link says how Path reaches Source: hardlink, copy or symlink.
	Link string `json:"link"`
}

// Weight is one graph weight: the value Name that layers read, made by
// applying Transforms to initializer Initializer, which holds checkpoint
// tensor Key: Length bytes at absolute byte Offset of Files[File].
type Weight struct {
	Name        string      `json:"name"`
	Initializer string      `json:"initializer"`
	File        int         `json:"file"`
	Key         string      `json:"key"`
	Offset      int64       `json:"offset"`
	Length      int64       `json:"length"`
	DType       string      `json:"dtype"`
	Shape       []int64     `json:"shape"`
	Transforms  []Transform `json:"transforms,omitempty"`
}

// Transform is one step from checkpoint tensor to graph weight.
type Transform struct {
	Op string `json:"op"`           // cast
	To string `json:"to,omitempty"` // cast: target dtype (float32, float16)
}

// Marshal renders the spec as indented JSON with a trailing newline.
func (s *Spec) Marshal() ([]byte, error) {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding weight spec: %w", err)
	}
	return append(data, '\n'), nil
}

// Compact renders the spec as one line, for model metadata.
func (s *Spec) Compact() (string, error) {
	data, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("encoding weight spec: %w", err)
	}
	return string(data), nil
}
