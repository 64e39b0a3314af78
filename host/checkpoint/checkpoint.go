// Package checkpoint reads a Hugging Face checkpoint directory without
// reading its weights: config.json, the safetensors index, and each shard's
// header, which locates every tensor to the byte.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

const (
	configFile = "config.json"
	indexFile  = "model.safetensors.index.json"
	singleFile = "model.safetensors"
)

// Checkpoint is a checkpoint's config and tensor inventory.
type Checkpoint struct {
	Dir           string // absolute
	ConfigJSON    []byte
	ModelType     string
	Architectures []string
	Shards        []Shard
	// BytesRead counts every byte read from the checkpoint: config, index
	// and headers. Tensor data is never read.
	BytesRead int64

	tensors map[string]*Tensor
	// sorted are the tensors in key order: walking them needs no lookups,
	// which were half of reading a quantisation (GLM-4.6-FP8: 88,000
	// tensors, several lookups each).
	sorted   []*Tensor
	keys     []string // made from sorted when asked
	keysOnce sync.Once
	shards   map[string]int // Shards' index by name
}

// Open reads dir's config.json, index and shard headers.
func Open(dir string) (*Checkpoint, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	info, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("checkpoint %s: not a directory", dir)
	}
	c := &Checkpoint{Dir: abs, tensors: map[string]*Tensor{}}
	if err := c.readConfig(); err != nil {
		return nil, err
	}
	if err := c.readShards(); err != nil {
		return nil, err
	}
	return c, nil
}

// OpenFile reads the header of one safetensors file, as a checkpoint of one
// shard without a config.
func OpenFile(path string) (*Checkpoint, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Dir: filepath.Dir(abs), tensors: map[string]*Tensor{}}
	sh, err := readShard(abs, filepath.Base(abs), &c.BytesRead)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.add(sh); err != nil {
		return nil, err
	}
	c.sort()
	return c, nil
}

func (c *Checkpoint) path(name string) string { return filepath.Join(c.Dir, name) }

// maxJSONBytes bounds config.json and the index (real ones are kilobytes to
// a few megabytes).
const maxJSONBytes = 256 << 20

func (c *Checkpoint) readFile(name string) ([]byte, error) {
	data, err := readRegular(c.path(name), maxJSONBytes)
	c.BytesRead += int64(len(data))
	return data, err
}

// ReadFile reads a small file beside the weights (a JSON of the release,
// such as hf_quant_config.json): regular files only, bounded in size.
func (c *Checkpoint) ReadFile(name string) ([]byte, error) {
	if err := checkRelative(name); err != nil {
		return nil, err
	}
	return c.readFile(name)
}

func (c *Checkpoint) readConfig() error {
	data, err := c.readFile(configFile)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: no config.json: not a Hugging Face checkpoint directory", c.Dir)
	}
	if err != nil {
		return inFile(c.path(configFile), err)
	}
	mt, archs, err := parseConfig(data)
	if err != nil {
		return fmt.Errorf("%s: %w", c.path(configFile), err)
	}
	c.ConfigJSON, c.ModelType, c.Architectures = data, mt, archs
	return nil
}

// parseConfig reads what the host needs of config.json: model_type and
// architectures.
func parseConfig(data []byte) (modelType string, architectures []string, err error) {
	var head struct {
		ModelType     any `json:"model_type"`
		Architectures any `json:"architectures"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return "", nil, fmt.Errorf("invalid JSON: %w", err)
	}
	mt, ok := head.ModelType.(string)
	if !ok || mt == "" {
		return "", nil, errors.New("no \"model_type\" string; strata chooses the architecture plugin by it")
	}
	switch a := head.Architectures.(type) {
	case nil:
	case []any:
		for _, v := range a {
			name, ok := v.(string)
			if !ok {
				return "", nil, fmt.Errorf("\"architectures\" holds %v, not a class name", v)
			}
			architectures = append(architectures, name)
		}
	default:
		return "", nil, fmt.Errorf("\"architectures\" is %v, not a list of class names", a)
	}
	return mt, architectures, nil
}

func (c *Checkpoint) readShards() error {
	index, err := c.readIndex()
	if err != nil {
		return err
	}
	if index.tensors > 0 { // one map and list of the right size, not 17 doublings of each
		c.tensors = make(map[string]*Tensor, index.tensors)
		c.sorted = make([]*Tensor, 0, index.tensors)
	}
	headers := c.readHeaders(index.shards)
	defer headers.stop()
	for i, name := range index.shards {
		h := headers.wait(i)
		c.BytesRead += h.bytesRead
		if errors.Is(h.err, fs.ErrNotExist) && index.data != nil {
			return fmt.Errorf("%s names shard %s, which is missing from %s", c.path(indexFile), name, c.Dir)
		}
		if h.err != nil {
			return inFile(c.path(name), h.err)
		}
		if err := c.add(h.shard); err != nil {
			return err
		}
	}
	// The index is checked against the headers while the tensors are
	// sorted: each reads what the other does not write (Kimi-K2's
	// 139,000 tensors: 42 and 33 ms).
	checked := make(chan error, 1)
	go func() { checked <- c.checkIndex(index) }()
	c.sort()
	if err := <-checked; err != nil {
		return err
	}
	return c.readUnindexed(index.shards)
}

// readUnindexed adds the tensors of the safetensors files beside the index
// (or beside model.safetensors) that it does not name: some releases keep their MTP layer in a standalone
// mtp.safetensors the index leaves out (GLM-4.7 repacks, Qwen3.5 FP8), and
// a plugin must see those tensors to find it. A key an indexed shard holds
// stays theirs (a consolidated copy beside the shards adds nothing).
func (c *Checkpoint) readUnindexed(named []string) error {
	entries, err := os.ReadDir(c.Dir)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", c.Dir, err)
	}
	added := false
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".safetensors") || strings.HasPrefix(name, ".") || slices.Contains(named, name) {
			continue
		}
		sh, err := readShard(c.path(name), name, &c.BytesRead)
		if err != nil {
			return inFile(c.path(name), fmt.Errorf("a safetensors file the index does not name, read for tensors it may hold (an MTP layer): %w", err))
		}
		sh.Tensors = slices.DeleteFunc(sh.Tensors, func(t Tensor) bool { _, indexed := c.tensors[t.Key]; return indexed })
		if len(sh.Tensors) == 0 {
			continue
		}
		sh.Unindexed = true
		if err := c.add(sh); err != nil {
			return err
		}
		added = true
	}
	if added {
		c.sort()
	}
	return nil
}

// checkRelative refuses shard names that would leave the checkpoint directory.
func checkRelative(name string) error {
	if filepath.IsAbs(name) || !filepath.IsLocal(name) {
		return errors.New("not a file name inside the checkpoint directory")
	}
	return nil
}

func (c *Checkpoint) noWeightsError() error {
	entries, _ := os.ReadDir(c.Dir)
	var torch, shards []string
	for _, e := range entries {
		switch n := e.Name(); {
		case strings.HasSuffix(n, ".bin") || strings.HasSuffix(n, ".pt") || strings.HasSuffix(n, ".pth"):
			torch = append(torch, n)
		case strings.HasSuffix(n, ".safetensors"):
			shards = append(shards, n)
		}
	}
	msg := fmt.Sprintf("%s: no %s and no %s", c.Dir, singleFile, indexFile)
	switch {
	case len(shards) > 0:
		msg += fmt.Sprintf(" naming the shards (found %s); a sharded checkpoint needs its index", strings.Join(shards, ", "))
	case len(torch) > 0:
		msg += fmt.Sprintf(" (found %s; PyTorch checkpoints must be converted to safetensors first)", strings.Join(torch, ", "))
	}
	return errors.New(msg)
}

func (c *Checkpoint) add(sh Shard) error {
	if c.shards == nil {
		c.shards = map[string]int{}
	}
	c.shards[sh.Name] = len(c.Shards)
	c.Shards = append(c.Shards, sh)
	s := &c.Shards[len(c.Shards)-1]
	for i := range s.Tensors {
		t := &s.Tensors[i]
		if prev, dup := c.tensors[t.Key]; dup {
			return fmt.Errorf("tensor %s is in both %s and %s", t.Key, prev.Shard, t.Shard)
		}
		c.tensors[t.Key] = t
		c.sorted = append(c.sorted, t)
	}
	return nil
}

// Tensor looks a key up.
func (c *Checkpoint) Tensor(key string) (*Tensor, bool) {
	t, ok := c.tensors[key]
	return t, ok
}

// Key is key as the checkpoint holds it (its own string, shared by
// everything that keeps the key) when it holds the tensor, else key: keys
// kept by the tens of thousands should not each be a copy.
func (c *Checkpoint) Key(key string) string {
	if t, ok := c.tensors[key]; ok {
		return t.Key
	}
	return key
}

// Keys lists all tensor keys, sorted.
func (c *Checkpoint) Keys() []string {
	c.keysOnce.Do(func() {
		c.keys = make([]string, len(c.sorted))
		for i, t := range c.sorted {
			c.keys[i] = t.Key
		}
	})
	return c.keys
}

// Sorted lists all tensors in key order (not to be modified).
func (c *Checkpoint) Sorted() []*Tensor { return c.sorted }

func (c *Checkpoint) sort() {
	slices.SortFunc(c.sorted, func(a, b *Tensor) int { return strings.Compare(a.Key, b.Key) })
}

// Shard looks a shard up by name.
// (By index: a linear search per tensor was 4% of a GLM-4.6 export.)
func (c *Checkpoint) Shard(name string) (*Shard, bool) {
	i, ok := c.shards[name]
	if !ok {
		return nil, false
	}
	return &c.Shards[i], true
}

// inFile names path in err, unless err already does (a NotRegularError).
func inFile(path string, err error) error {
	var nr *NotRegularError
	if errors.As(err, &nr) {
		return err
	}
	return fmt.Errorf("%s: %w", path, err)
}
