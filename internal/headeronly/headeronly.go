// Package headeronly writes Hugging Face checkpoints shaped exactly like real
// releases — config.json, shard split, index, safetensors headers — whose
// tensor data are sparse holes, so benchmarks and scale tests can open a
// Llama-3.1-405B checkpoint (≈810 GB apparent) that takes a few MB of disk.
package headeronly

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/strata-llm/strata/sdk/dtype"
	"github.com/strata-llm/strata/sdk/hf"
)

// File names, as save_pretrained writes them.
const (
	configFile = "config.json"
	indexFile  = "model.safetensors.index.json"
	singleFile = "model.safetensors"
)

// Tensor is one tensor to write.
type Tensor struct {
	Name  string
	DType string // safetensors name: BF16, F32, F8_E4M3, ...
	Shape []int64
}

// Stats describes a written checkpoint.
type Stats struct {
	Shards        int
	Tensors       int
	TensorBytes   int64 // sum of tensor data sizes: the index's total_size
	HeaderBytes   int64 // sum over shards of the 8-byte length + JSON header
	ApparentBytes int64 // sum of shard file sizes: HeaderBytes + TensorBytes
}

// generators maps a config's model_type to the tensors its checkpoint holds.
var generators = map[string]func(configJSON []byte, dtype string) ([]Tensor, error){
	"llama":            LlamaTensors,
	"qwen3_moe":        Qwen3MoeTensors,
	"gpt_oss":          GptOssTensors,
	"glm4_moe":         Glm4MoeTensors,
	"deepseek_v3":      DeepseekTensors,
	"kimi_k2":          DeepseekTensors,
	"glm4_moe_lite":    DeepseekTensors,
	"qwen3_vl":         Qwen3VLTensors,
	"qwen3_vl_moe":     Qwen3VLMoeTensors,
	"qwen3_next":       qwen35Generator("qwen3_next"),
	"qwen3_5_text":     qwen35Generator("qwen3_5_text"),
	"qwen3_5_moe_text": qwen35Generator("qwen3_5_moe_text"),
	"qwen3_5":          qwen35Generator("qwen3_5"),
	"qwen3_5_moe":      qwen35Generator("qwen3_5_moe"),
}

// Tensors lists the tensors of a checkpoint of configJSON's model_type, in
// dtype, or as its quantization_config stores them (quantize).
func Tensors(configJSON []byte, dtype string) ([]Tensor, error) {
	c, err := hf.Parse(configJSON)
	if err != nil {
		return nil, err
	}
	mt, err := c.String("model_type")
	if err != nil {
		return nil, err
	}
	gen, ok := generators[mt]
	if !ok {
		return nil, fmt.Errorf("config.json: model_type %q is not supported; supported: %s", mt, strings.Join(supported(), ", "))
	}
	ts, err := gen(configJSON, dtype)
	if err != nil {
		return nil, err
	}
	return quantize(configJSON, dtype, ts)
}

func supported() []string {
	names := make([]string, 0, len(generators))
	for n := range generators {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// sized is a Tensor with its data size.
type sized struct {
	Tensor
	bytes int64
}

// Write writes configJSON and tensors into dir as a checkpoint whose shards
// hold at most maxShardBytes of tensor data each (unless one tensor alone is
// larger), split in order like save_pretrained. Existing files are never
// overwritten. The data regions are sparse: no data blocks are written.
func Write(dir string, configJSON []byte, tensors []Tensor, maxShardBytes int64) (Stats, error) {
	if maxShardBytes <= 0 {
		return Stats{}, fmt.Errorf("max shard bytes must be positive, got %d", maxShardBytes)
	}
	ts, err := sizeAll(tensors)
	if err != nil {
		return Stats{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Stats{}, err
	}
	if err := createFile(filepath.Join(dir, configFile), configJSON, 0); err != nil {
		return Stats{}, err
	}
	shards := split(ts, maxShardBytes)
	st := Stats{Shards: len(shards), Tensors: len(ts)}
	weightMap := map[string]string{}
	for i, shard := range shards {
		name := shardName(i, len(shards))
		header, data := encodeHeader(shard)
		if err := createFile(filepath.Join(dir, name), header, data); err != nil {
			return Stats{}, err
		}
		for _, t := range shard {
			weightMap[t.Name] = name
		}
		st.TensorBytes += data
		st.HeaderBytes += int64(len(header))
	}
	st.ApparentBytes = st.HeaderBytes + st.TensorBytes
	if len(shards) == 1 {
		return st, nil // a single shard is model.safetensors, with no index
	}
	if err := writeIndex(filepath.Join(dir, indexFile), st.TensorBytes, weightMap); err != nil {
		return Stats{}, err
	}
	return st, nil
}

// sizeAll checks every tensor and computes its data size.
func sizeAll(tensors []Tensor) ([]sized, error) {
	if len(tensors) == 0 {
		return nil, errors.New("no tensors to write")
	}
	seen := map[string]bool{}
	out := make([]sized, len(tensors))
	for i, t := range tensors {
		info, ok := dtype.FromSafetensors(t.DType)
		switch {
		case t.Name == "":
			return nil, fmt.Errorf("tensor %d has no name", i)
		case seen[t.Name]:
			return nil, fmt.Errorf("tensor %s is listed twice", t.Name)
		case !ok:
			return nil, fmt.Errorf("tensor %s: unknown safetensors dtype %q", t.Name, t.DType)
		}
		seen[t.Name] = true
		n, err := elements(t.Shape)
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
		}
		out[i] = sized{t, info.ByteSize(n)}
	}
	return out, nil
}

// elements counts shape's elements, refusing counts whose size in bits
// would overflow int64.
func elements(shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/64/d) {
			return 0, fmt.Errorf("shape %v: negative dimension or too many elements", shape)
		}
		n *= d
	}
	return n, nil
}

// split groups ts, in order, into shards of at most limit data bytes,
// closing a shard when the next tensor would overflow it. A tensor over limit
// gets a shard of its own. (huggingface_hub puts such a tensor in its own
// shard ahead of the one being filled; keeping order is simpler, and no
// Llama release has a tensor over 5 GB.) A quantised weight's scales that
// follow it (X.weight_scale_inv, X.weight_scale) go with it, as one tensor.
func split(ts []sized, limit int64) [][]sized {
	var shards [][]sized
	var cur []sized
	var size int64
	for i := 0; i < len(ts); {
		j, n := i+1, ts[i].bytes
		for ; j < len(ts) && strings.HasPrefix(ts[j].Name, ts[i].Name+"_"); j++ {
			n += ts[j].bytes
		}
		if len(cur) > 0 && size+n > limit {
			shards = append(shards, cur)
			cur, size = nil, 0
		}
		cur = append(cur, ts[i:j]...)
		size += n
		i = j
	}
	return append(shards, cur)
}

func shardName(i, n int) string {
	if n == 1 {
		return singleFile
	}
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n)
}

// writeOrder ranks dtypes the way the safetensors library lays data out:
// larger alignment first (measured with safetensors 0.8.0; F4's place is
// from the library's enum order). Within a rank, tensors are in name order.
var writeOrder = []string{
	"U64", "I64", "F64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16",
	"F8_E8M0", "F8_E4M3", "F8_E5M2", "I8", "U8", "F4", "BOOL",
}

// headerEntry is one tensor of a safetensors header, fields in the
// reference writer's order.
type headerEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// encodeHeader lays shard out as the safetensors library would: data in
// writeOrder, header keys in data order after save_pretrained's
// __metadata__, JSON padded with spaces to 8 bytes. It returns the 8-byte
// length plus header, and the data size.
func encodeHeader(shard []sized) ([]byte, int64) {
	ts := slices.Clone(shard)
	sort.SliceStable(ts, func(i, j int) bool {
		ri, rj := slices.Index(writeOrder, ts[i].DType), slices.Index(writeOrder, ts[j].DType)
		return ri < rj || (ri == rj && ts[i].Name < ts[j].Name)
	})
	var js bytes.Buffer
	js.WriteString(`{"__metadata__":{"format":"pt"}`)
	var off int64
	for _, t := range ts {
		name, _ := json.Marshal(t.Name)
		entry, _ := json.Marshal(headerEntry{t.DType, shapeOf(t.Shape), [2]int64{off, off + t.bytes}})
		js.WriteByte(',')
		js.Write(name)
		js.WriteByte(':')
		js.Write(entry)
		off += t.bytes
	}
	js.WriteByte('}')
	for js.Len()%8 != 0 {
		js.WriteByte(' ')
	}
	out := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+js.Len()), uint64(js.Len()))
	return append(out, js.Bytes()...), off
}

// shapeOf makes a scalar's shape [] rather than null.
func shapeOf(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

func writeIndex(path string, totalSize int64, weightMap map[string]string) error {
	type metadata struct {
		TotalSize int64 `json:"total_size"`
	}
	idx := struct {
		Metadata  metadata          `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}{metadata{totalSize}, weightMap}
	b, err := json.MarshalIndent(idx, "", "  ") // keys sorted, like save_pretrained
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return createFile(path, append(b, '\n'), 0)
}

// createFile writes head to a new file at path and extends it by hole bytes
// with Truncate, which allocates no blocks.
func createFile(path string, head []byte, hole int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s already exists; refusing to overwrite it: %w", path, err)
	}
	if err != nil {
		return err
	}
	_, err = f.Write(head)
	if err == nil && hole > 0 {
		err = f.Truncate(int64(len(head)) + hole)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
