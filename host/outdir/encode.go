package outdir

import (
	"encoding/json"
	"slices"
	"sort"
)

// manifestEncoder writes the manifest as json.Marshal does
// (TestManifestEncoderIsJSONMarshal), keeping each path's encoded entries
// until they change: the manifest is rewritten before every file gets its
// name (330 times in a layerwise GLM-4.6 export), and encoding every entry
// every time grew with the square of the files.
type manifestEncoder struct {
	byPath map[string]encodedEntries
}

type encodedEntries struct {
	entries []Entry
	json    []byte // `"path":[...]`
}

func (c *manifestEncoder) encode(m manifest) ([]byte, error) {
	head, err := json.Marshal(struct {
		Format   string   `json:"format"`
		Version  int      `json:"version"`
		Tool     string   `json:"tool"`
		Sessions []string `json:"sessions,omitempty"`
	}{m.Format, m.Version, m.Tool, m.Sessions})
	if err != nil {
		return nil, err
	}
	if m.Entries == nil {
		return append(head[:len(head)-1], `,"entries":null}`...), nil
	}
	if c.byPath == nil {
		c.byPath = map[string]encodedEntries{}
	}
	paths := make([]string, 0, len(m.Entries))
	size := len(head) + 16
	for p, es := range m.Entries {
		paths = append(paths, p)
		enc, ok := c.byPath[p]
		if !ok || !slices.Equal(enc.entries, es) {
			if enc, err = encodeEntries(p, es); err != nil {
				return nil, err
			}
			c.byPath[p] = enc
		}
		size += len(enc.json) + 1
	}
	for p := range c.byPath {
		if _, ok := m.Entries[p]; !ok {
			delete(c.byPath, p)
		}
	}
	sort.Strings(paths)
	b := make([]byte, 0, size)
	b = append(append(b, head[:len(head)-1]...), `,"entries":{`...)
	for i, p := range paths {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, c.byPath[p].json...)
	}
	return append(b, "}}"...), nil
}

func encodeEntries(path string, es []Entry) (encodedEntries, error) {
	key, err := json.Marshal(path)
	if err != nil {
		return encodedEntries{}, err
	}
	value, err := json.Marshal(es)
	if err != nil {
		return encodedEntries{}, err
	}
	return encodedEntries{entries: slices.Clone(es), json: append(append(key, ':'), value...)}, nil
}
