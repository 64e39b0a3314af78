package sdk

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
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
	c := inv.Checker(5)
	c.Expect(want...)
	return c.Err()
}

// ExpectedTensor is one tensor a plugin will bind.
type ExpectedTensor struct {
	Key   string
	Shape []int64
}

// Checker collects the problems of many expected tensors, at most max of
// them: a check stops early instead of building an error per tensor a
// config.json count (10⁹ experts) makes up.
type Checker struct {
	inv  Inventory
	max  int
	errs []error
}

// Checker starts a bounded check against inv.
func (inv Inventory) Checker(max int) *Checker { return &Checker{inv: inv, max: max} }

// Expect checks tensors until max problems are found.
func (c *Checker) Expect(want ...ExpectedTensor) {
	for _, w := range want {
		if c.Full() {
			return
		}
		if err := c.inv.Expect(w.Key, w.Shape...); err != nil {
			c.errs = append(c.errs, err)
		}
	}
}

// Full reports whether max problems were found: checking more is moot.
func (c *Checker) Full() bool { return len(c.errs) >= c.max }

// Err joins the problems found, or is nil.
func (c *Checker) Err() error {
	if len(c.errs) == 0 {
		return nil
	}
	msg := make([]string, len(c.errs))
	for i, e := range c.errs {
		msg[i] = e.Error()
	}
	out := strings.Join(msg, "; ")
	if c.Full() {
		out += fmt.Sprintf(" (stopped after %d problems)", c.max)
	}
	return fmt.Errorf("%s", out)
}

// HasPrefix reports whether some key starts with prefix.
func (inv Inventory) HasPrefix(prefix string) bool {
	for k := range inv {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// LayerIndices lists, sorted, the indices i of the keys "<prefix><i>.…".
func (inv Inventory) LayerIndices(prefix string) []int {
	seen := map[int]bool{}
	for k := range inv {
		rest, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		digits, _, _ := strings.Cut(rest, ".")
		if n, err := strconv.Atoi(digits); err == nil && n >= 0 {
			seen[n] = true
		}
	}
	out := make([]int, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
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

// PrefixesHolding lists, in order, the prefixes p of prefixes under which
// the checkpoint holds a key starting p+probe: the on-disk layouts its keys
// are in (probe "layers." tells "language_model.model." from
// "language_model.", whose layers are "language_model.layers.").
func (inv Inventory) PrefixesHolding(probe string, prefixes []string) []string {
	var out []string
	for _, p := range prefixes {
		if inv.HasPrefix(p + probe) {
			out = append(out, p)
		}
	}
	return out
}

// ErrNoLayout is the error PickPrefix wraps when the checkpoint holds keys
// under none of the prefixes.
var ErrNoLayout = errors.New("no known key layout")

// PickPrefix is the one prefix of prefixes (the key layouts a plugin reads)
// under which the checkpoint holds keys <prefix><probe>…; what names them in
// errors ("the language model's layers"). Keys under none of them is an
// error wrapping ErrNoLayout, naming every prefix and the keys' first
// components; under several, an error naming them (one checkpoint, one
// layout: a loader would read one copy over the other).
func (inv Inventory) PickPrefix(what, probe string, prefixes []string) (string, error) {
	held := inv.PrefixesHolding(probe, prefixes)
	switch len(held) {
	case 1:
		return held[0], nil
	case 0:
		return "", fmt.Errorf("%w: the checkpoint holds %s under none of the prefixes read (%s; its keys start with %s): "+
			"export a checkpoint of this architecture, with its keys as transformers saves or loads them",
			ErrNoLayout, what, starred(prefixes, probe), inv.firstComponents(4))
	default:
		return "", fmt.Errorf("the checkpoint holds %s twice, under %s: keep one layout "+
			"(delete the other's tensors from the safetensors files, or load and save_pretrained it again with transformers)",
			what, starred(held, probe))
	}
}

// starred lists prefix+probe+"*" for each prefix, joined by commas.
func starred(prefixes []string, probe string) string {
	out := make([]string, len(prefixes))
	for i, p := range prefixes {
		out[i] = p + probe + "*"
	}
	return strings.Join(out, ", ")
}

// firstComponents lists, sorted, up to n distinct first dotted components
// of the keys ("model.", "lm_head."), "nothing" for an empty inventory.
func (inv Inventory) firstComponents(n int) string {
	seen := map[string]bool{}
	for k := range inv {
		c, _, _ := strings.Cut(k, ".")
		seen[c+"."] = true
	}
	if len(seen) == 0 {
		return "nothing"
	}
	out := make([]string, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	slices.Sort(out)
	if len(out) > n {
		out = append(out[:n], "…")
	}
	return strings.Join(out, ", ")
}
