package sdk

import (
	"fmt"
	"slices"
	"strings"

	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// Inventory indexes a checkpoint's tensor list for a plugin's checks.
type Inventory map[string]*pb.TensorInfo

// NewInventory indexes the tensors of a request's model.
func NewInventory(m *pb.Model) Inventory {
	inv := make(Inventory, len(m.GetTensors()))
	for _, t := range m.GetTensors() {
		inv[t.Key] = t
	}
	return inv
}

// Has reports whether the checkpoint holds key.
func (inv Inventory) Has(key string) bool {
	_, ok := inv[key]
	return ok
}

// Expect checks that key exists with the shape the config implies; the
// error names the tensor and both shapes.
func (inv Inventory) Expect(key string, shape ...int64) error {
	t, ok := inv[key]
	if !ok {
		return fmt.Errorf("tensor %s is missing from the checkpoint", key)
	}
	if !slices.Equal(t.Shape, shape) {
		return fmt.Errorf("tensor %s has shape %v, but config.json implies %v", key, t.Shape, shape)
	}
	return nil
}

// ExpectAll checks every key → shape and reports the first few problems.
func (inv Inventory) ExpectAll(want []ExpectedTensor) error {
	var errs []error
	for _, w := range want {
		if err := inv.Expect(w.Key, w.Shape...); err != nil {
			errs = append(errs, err)
		}
	}
	return joinFirst(errs, 5)
}

// ExpectedTensor is one tensor a plugin will bind.
type ExpectedTensor struct {
	Key   string
	Shape []int64
}

func joinFirst(errs []error, n int) error {
	if len(errs) == 0 {
		return nil
	}
	msg := errs[0].Error()
	for _, e := range errs[1:min(n, len(errs))] {
		msg += "; " + e.Error()
	}
	if len(errs) > n {
		msg += fmt.Sprintf("; and %d more", len(errs)-n)
	}
	return fmt.Errorf("%s", msg)
}

// CheckResult is Check's answer for a model whose loading gave err: not
// supported, with err as the reason; or supported, whole and layerwise.
func CheckResult(err error) *pb.CheckResponse {
	if err != nil {
		return &pb.CheckResponse{Reasons: []string{err.Error()}}
	}
	return &pb.CheckResponse{Supported: true, LayerwiseSupported: true}
}

// PluginOptions checks that opts names only the given keys and returns them
// with defaults filled in; an unknown key is an error naming the known ones.
func PluginOptions(opts *pb.ExportOptions, plugin string, defaults map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for k, v := range defaults {
		out[k] = v
	}
	for k, v := range opts.GetPluginOptions() {
		if _, known := defaults[k]; !known {
			return nil, fmt.Errorf("plugin %s has no option %q (it has: %s)", plugin, k, keyList(defaults))
		}
		out[k] = v
	}
	return out, nil
}

func keyList(m map[string]string) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}
