package convert

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// MTP conventions: where a checkpoint keeps its multi-token-prediction
// weights (reference/checkpoint-export.md §5).
const (
	// MTPInlined: extra decoder layers model.layers.{N} for N ≥
	// num_hidden_layers (DeepSeek-V3, GLM-4.5..5).
	MTPInlined = "inlined"
	// MTPSeparateFile: a safetensors file the index does not name
	// (GLM-4.7 repacks, Qwen3.5 FP8's mtp.safetensors).
	MTPSeparateFile = "separate-file"
	// MTPIndexed: mtp.* keys in ordinary indexed shards (Qwen3-Next).
	MTPIndexed = "indexed"
)

// MTPDescription is one MTP layout, as a plugin declares it (its Plan says
// "convention, layers, keys") or as DetectMTP finds it.
type MTPDescription struct {
	Convention string `json:"convention"`
	// Layers are the global decoder-layer indices of inlined MTP layers.
	Layers []int `json:"layers,omitempty"`
	// Keys are key prefixes (dotted, without the trailing dot) of indexed
	// MTP tensors, e.g. "mtp".
	Keys []string `json:"keys,omitempty"`
	// Files are the file names of separate MTP files.
	Files []string `json:"files,omitempty"`
}

// MTP is the resolved layout: which source tensors are MTP weights, and the
// module prefixes that the quantisation config's exclusion list names.
type MTP struct {
	Descriptions []MTPDescription `json:"descriptions"`
	Layers       []int            `json:"layers,omitempty"` // decoder layers that are MTP layers
	Keys         []string         `json:"keys"`             // every MTP tensor key, sorted
	Prefixes     []string         `json:"prefixes"`         // exclusion prefixes, sorted
	isKey        map[string]bool
}

// IsMTP reports whether a source key is an MTP tensor.
func (m *MTP) IsMTP(key string) bool { return m.isKey[key] }

// DetectMTP is the generic detector used when no plugin describes the MTP
// layout: inlined model.layers.{N} for N in [num_hidden_layers,
// num_hidden_layers+num_nextn_predict_layers) whose keys do not contain
// "mtp"; every safetensors file the index does not name; indexed keys with
// a dotted component starting with "mtp".
func DetectMTP(inv *inventory) ([]MTPDescription, error) {
	n, err := inv.configInt("num_hidden_layers")
	if err != nil {
		return nil, err
	}
	nextn, err := inv.configInt("num_nextn_predict_layers")
	if err != nil {
		return nil, err
	}
	var out []MTPDescription
	if nextn > 0 {
		d := MTPDescription{Convention: MTPInlined}
		for i := n; i < n+nextn; i++ {
			for _, k := range inv.keys {
				if l, _ := layerOf(k); l == i && !strings.Contains(k, "mtp") {
					d.Layers = append(d.Layers, i)
					break
				}
			}
		}
		if len(d.Layers) > 0 {
			out = append(out, d)
		}
	}
	if len(inv.unindexed) > 0 {
		out = append(out, MTPDescription{Convention: MTPSeparateFile, Files: slices.Clone(inv.unindexed)})
	}
	prefixes := map[string]bool{}
	for _, k := range inv.keys {
		if s := inv.tensors[k]; s.Indexed {
			if p := mtpComponentPrefix(k); p != "" {
				prefixes[p] = true
			}
		}
	}
	if len(prefixes) > 0 {
		out = append(out, MTPDescription{Convention: MTPIndexed, Keys: sortedKeys(prefixes)})
	}
	return out, nil
}

// mtpComponentPrefix is the key up to its first dotted component that
// starts with "mtp" ("mtp.fc.weight" -> "mtp", "model.mtp_block.x" ->
// "model.mtp_block"), or "".
func mtpComponentPrefix(key string) string {
	parts := strings.Split(key, ".")
	for i, p := range parts[:len(parts)-1] {
		if strings.HasPrefix(p, "mtp") {
			return strings.Join(parts[:i+1], ".")
		}
	}
	return ""
}

var layersDigit = regexp.MustCompile(`^(.*?layers\.\d+)\.`)

// ResolveMTP applies explicit descriptions (a plugin's, or DetectMTP's) to
// the inventory. A description that matches no tensor is an error: the
// plugin and the checkpoint disagree.
func ResolveMTP(inv *inventory, descs []MTPDescription) (*MTP, error) {
	m := &MTP{Descriptions: descs, isKey: map[string]bool{}}
	prefixes := map[string]bool{}
	layers := map[int]bool{}
	for _, d := range descs {
		matched := 0
		switch d.Convention {
		case MTPInlined:
			for _, k := range inv.keys {
				if l, p := layerOf(k); l >= 0 && slices.Contains(d.Layers, l) {
					m.isKey[k] = true
					prefixes[p] = true
					layers[l] = true
					matched++
				}
			}
		case MTPIndexed:
			for _, k := range inv.keys {
				for _, p := range d.Keys {
					if hasPrefix(k, p) {
						m.isKey[k] = true
						prefixes[p] = true
						matched++
						break
					}
				}
			}
		case MTPSeparateFile:
			for _, k := range inv.keys {
				s := inv.tensors[k]
				if s.Indexed || !slices.Contains(d.Files, filepath.Base(s.Shard)) {
					continue
				}
				m.isKey[k] = true
				matched++
				if l, p := layerOf(k); l >= 0 {
					prefixes[p] = true
					layers[l] = true
				} else {
					for _, p := range separatePrefixes(k) {
						prefixes[p] = true
					}
				}
			}
		default:
			return nil, fmt.Errorf("unknown MTP convention %q (known: %s, %s, %s)", d.Convention, MTPInlined, MTPSeparateFile, MTPIndexed)
		}
		if matched == 0 {
			return nil, fmt.Errorf("the MTP layout %s %v%v%v matches no tensor of the checkpoint: the plugin and the checkpoint disagree", d.Convention, d.Layers, d.Keys, d.Files)
		}
	}
	for p := range prefixes {
		if p == "model" || p == "" {
			return nil, fmt.Errorf("an MTP exclusion prefix %q would exclude the whole model from quantisation", p)
		}
	}
	m.Prefixes = sortedKeys(prefixes)
	m.Keys = sortedKeys(m.isKey)
	for l := range layers {
		m.Layers = append(m.Layers, l)
	}
	sort.Ints(m.Layers)
	return m, nil
}

// separatePrefixes derives exclusion prefixes for a key of a separate MTP
// file outside any decoder layer: its first dotted component unless that is
// "model" (which would exclude the backbone), then the first
// "...layers.<d>" prefix; for a key under model.* without those, the key up
// to its mtp component, else the module itself.
func separatePrefixes(key string) []string {
	var out []string
	first, _, _ := strings.Cut(key, ".")
	if first != "model" && first != key {
		out = append(out, first)
	}
	if m := layersDigit.FindStringSubmatch(key); m != nil && m[1] != "model" {
		out = append(out, m[1])
	}
	if len(out) == 0 {
		if p := mtpComponentPrefix(key); p != "" {
			out = append(out, p)
		} else {
			out = append(out, moduleOf(key))
		}
	}
	return out
}

// moduleOf is the module a parameter key belongs to: the key without its
// last component.
func moduleOf(key string) string {
	if i := strings.LastIndexByte(key, '.'); i > 0 {
		return key[:i]
	}
	return key
}

func sortedKeys[T any](m map[string]T) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
