package convert

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/strata-llm/strata/host/checkpoint"
)

// source is one tensor of the source checkpoint and the file holding it.
type source struct {
	checkpoint.Tensor
	Path    string // absolute path of the shard
	Indexed bool   // named by the index (or the single model.safetensors)
}

// inventory is every tensor of the source: the indexed shards and every
// other *.safetensors file in the directory (a standalone mtp.safetensors
// is not in the index).
type inventory struct {
	ckpt      *checkpoint.Checkpoint // the headers, as host/quant reads them
	dir       string
	config    map[string]any
	configRaw []byte
	tensors   map[string]*source
	keys      []string // sorted
	unindexed []string // file names of safetensors files the index does not name
}

// sources is what strata reads of the source: its directory and every
// shard (links resolved); the output may hold none of them.
func (inv *inventory) sources() []string {
	out := []string{inv.dir}
	seen := map[string]bool{}
	for _, k := range inv.keys {
		if p := inv.tensors[k].Path; !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// dirs are the directories the source's files are in: the checkpoint's,
// and the blobs' of a Hugging Face cache.
func (inv *inventory) dirs() []string {
	out := []string{inv.dir}
	for _, p := range inv.sources()[1:] {
		if d := filepath.Dir(p); !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// openInventory reads the source's config and every safetensors header.
func openInventory(dir string) (*inventory, error) {
	ck, err := checkpoint.Open(dir)
	if err != nil {
		return nil, err
	}
	inv := &inventory{ckpt: ck, dir: ck.Dir, configRaw: ck.ConfigJSON, tensors: map[string]*source{}}
	dec := json.NewDecoder(bytes.NewReader(ck.ConfigJSON))
	dec.UseNumber()
	if err := dec.Decode(&inv.config); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", filepath.Join(ck.Dir, "config.json"), err)
	}
	indexed := map[string]bool{}
	for _, sh := range ck.Shards {
		if sh.Unindexed { // read below as a separate file, with its own checks
			continue
		}
		indexed[sh.Name] = true
		path, err := regularFile(sh.Path)
		if err != nil {
			return nil, err
		}
		for _, t := range sh.Tensors {
			inv.tensors[t.Key] = &source{Tensor: t, Path: path, Indexed: true}
		}
	}
	names, err := filepath.Glob(filepath.Join(ck.Dir, "*.safetensors"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	for _, p := range names {
		name := filepath.Base(p)
		if indexed[name] {
			continue
		}
		path, err := regularFile(p)
		if err != nil {
			return nil, err
		}
		one, err := checkpoint.OpenFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s is not named by the index, so strata reads it as a separate file (a standalone mtp.safetensors is one): %w", p, err)
		}
		inv.unindexed = append(inv.unindexed, name)
		for _, key := range one.Keys() {
			t, _ := one.Tensor(key)
			if prev, dup := inv.tensors[key]; dup {
				return nil, fmt.Errorf("tensor %s is in %s and also in %s, which the index does not name: remove the stray file from the source or move it aside, then re-run", key, filepath.Base(prev.Path), name)
			}
			tt := *t
			tt.Shard = name
			inv.tensors[key] = &source{Tensor: tt, Path: path}
		}
	}
	for k := range inv.tensors {
		inv.keys = append(inv.keys, k)
	}
	sort.Strings(inv.keys)
	return inv, nil
}

// read returns a source tensor's stored bytes (a transform.Reader: the
// stored parts of a quantised weight, which its expression dequantises).
func (inv *inventory) read(key string) ([]byte, error) {
	s, ok := inv.tensors[key]
	if !ok {
		return nil, fmt.Errorf("tensor %s is not in the source", key)
	}
	f, err := os.Open(s.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, s.Length)
	if _, err := f.ReadAt(buf, s.Offset); err != nil {
		return nil, fmt.Errorf("reading %s from %s: %w", key, s.Path, err)
	}
	return buf, nil
}

// regularFile resolves links (the Hugging Face cache links blobs) and
// refuses anything that is not a regular file.
func regularFile(p string) (string, error) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	info, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", p)
	}
	return real, nil
}

// configInt reads an integer field at the top of config.json or under
// text_config; null or absent is 0.
func (inv *inventory) configInt(field string) (int, error) {
	for _, m := range []map[string]any{inv.config, textConfig(inv.config)} {
		if m == nil {
			continue
		}
		v, ok := m[field]
		if !ok || v == nil {
			continue
		}
		n, ok := v.(json.Number)
		if !ok {
			return 0, fmt.Errorf("config.json: %q is %v, not an integer", field, v)
		}
		i, err := strconv.Atoi(n.String())
		if err != nil || i < 0 {
			return 0, fmt.Errorf("config.json: %q is %v, not a non-negative integer", field, v)
		}
		return i, nil
	}
	return 0, nil
}

func textConfig(c map[string]any) map[string]any {
	m, _ := c["text_config"].(map[string]any)
	return m
}

// layerKey matches the key of a decoder layer's tensor under any prefix a
// plugin reads the language model under (decoder.Architecture.Prefixes):
// model.layers.{i}., and a multimodal release's model.language_model.,
// language_model.model., language_model. and the doubled .model.model.
// (longest first: the first alternative that matches is taken).
var layerKey = regexp.MustCompile(`^((?:model\.language_model\.model\.|language_model\.model\.model\.|model\.language_model\.|language_model\.model\.|language_model\.|model\.)layers\.)(\d+)\.`)

// layerOf is the decoder layer a key belongs to, and the layer's prefix
// (e.g. "model.layers.3"); -1 when it belongs to none.
func layerOf(key string) (int, string) {
	m := layerKey.FindStringSubmatch(key)
	if m == nil {
		return -1, ""
	}
	i, err := strconv.Atoi(m[2])
	if err != nil {
		return -1, ""
	}
	return i, m[1] + m[2]
}

// hasPrefix reports whether key is prefix itself or starts with prefix + ".".
func hasPrefix(key, prefix string) bool {
	return key == prefix || strings.HasPrefix(key, prefix+".")
}
