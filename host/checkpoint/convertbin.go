package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/strata-llm/strata/internal/atomic"
	"github.com/strata-llm/strata/sdk/dtype"
)

const (
	binSingle = "pytorch_model.bin"
	binIndex  = "pytorch_model.bin.index.json"
	// ConvertedMarker records, in a conversion's directory, what it was
	// converted from; it is written last, so its presence means complete.
	ConvertedMarker = "strata-converted-from.json"
)

// IsBin reports whether dir holds a PyTorch .bin checkpoint.
func IsBin(dir string) bool {
	for _, name := range []string{binIndex, binSingle} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return true
		}
	}
	return false
}

// conversion is what the marker records: the source and its files.
type conversion struct {
	Source string       `json:"source"`
	Files  []sourceFile `json:"files"`
}

type sourceFile struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	ModTime int64  `json:"mtime_unix_nano"`
}

// Converted describes a finished .bin conversion.
type Converted struct {
	Dir     string
	Reused  bool // an earlier conversion of the same files was kept
	Tensors int
	Shards  int
}

// ConvertBin writes the PyTorch .bin checkpoint in src as safetensors into
// dst (the same shard split, model.safetensors[.index.json], and src's other
// files), one tensor in memory at a time. A dst holding a complete
// conversion of the same source files is reused as it is.
func ConvertBin(src, dst string) (*Converted, error) {
	src, err := filepath.Abs(src)
	if err != nil {
		return nil, err
	}
	shards, err := binShards(src)
	if err != nil {
		return nil, err
	}
	want, err := describeSource(src, shards)
	if err != nil {
		return nil, err
	}
	if reused(dst, want) {
		return &Converted{Dir: dst, Reused: true, Shards: len(shards)}, nil
	}
	if err := prepareConversion(dst); err != nil {
		return nil, err
	}
	res := &Converted{Dir: dst, Shards: len(shards)}
	weightMap := map[string]string{}
	var total int64
	for _, shard := range shards {
		out := safetensorsName(shard, len(shards))
		keys, bytes, err := convertShard(filepath.Join(src, shard), filepath.Join(dst, out))
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			if prev, dup := weightMap[k]; dup {
				return nil, fmt.Errorf("tensor %s is in both %s and %s", k, prev, shard)
			}
			weightMap[k] = out
		}
		res.Tensors += len(keys)
		total += bytes
	}
	if err := finishConversion(src, dst, weightMap, total, len(shards), want); err != nil {
		return nil, err
	}
	return res, nil
}

// binShards lists the .bin files: those the index names, or the single one.
func binShards(src string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(src, binIndex))
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(src, binSingle)); err != nil {
			return nil, fmt.Errorf("%s: no %s and no %s: not a PyTorch .bin checkpoint", src, binSingle, binIndex)
		}
		return []string{binSingle}, nil
	}
	if err != nil {
		return nil, err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil || len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: invalid index (no weight_map)", filepath.Join(src, binIndex))
	}
	var names []string
	for _, f := range idx.WeightMap {
		if err := checkRelative(f); err != nil {
			return nil, fmt.Errorf("%s: shard %q: %w", filepath.Join(src, binIndex), f, err)
		}
		if !slices.Contains(names, f) {
			names = append(names, f)
		}
	}
	sort.Strings(names)
	return names, nil
}

// safetensorsName maps pytorch_model-00001-of-00002.bin to
// model-00001-of-00002.safetensors, and the single file to model.safetensors.
func safetensorsName(bin string, shards int) string {
	if shards == 1 {
		return singleFile
	}
	name := strings.TrimSuffix(bin, ".bin") + ".safetensors"
	return strings.Replace(name, "pytorch_model", "model", 1)
}

func describeSource(src string, shards []string) (conversion, error) {
	c := conversion{Source: src}
	for _, name := range shards {
		info, err := os.Stat(filepath.Join(src, name))
		if err != nil {
			return c, fmt.Errorf("%s names %s: %w", src, name, err)
		}
		c.Files = append(c.Files, sourceFile{Name: name, Size: info.Size(), ModTime: info.ModTime().UnixNano()})
	}
	return c, nil
}

func reused(dst string, want conversion) bool {
	data, err := os.ReadFile(filepath.Join(dst, ConvertedMarker))
	if err != nil {
		return false
	}
	var got conversion
	if json.Unmarshal(data, &got) != nil {
		return false
	}
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(want)
	return string(a) == string(b)
}

// prepareConversion requires dst to be new, empty, or an earlier
// (possibly unfinished) conversion, whose files it removes.
func prepareConversion(dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("conversion directory %s cannot be created: %w", dst, err)
	}
	entries, err := os.ReadDir(dst)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dst, ConvertedMarker)); err != nil && !hasConvertedFiles(entries) {
		return fmt.Errorf("conversion directory %s already holds files strata did not write; choose an empty or new directory", dst)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// hasConvertedFiles recognises an interrupted conversion: only safetensors
// shards, their index, json side files and temporary files.
func hasConvertedFiles(entries []fs.DirEntry) bool {
	for _, e := range entries {
		n := e.Name()
		if !strings.HasSuffix(n, ".safetensors") && !strings.HasSuffix(n, ".json") && !strings.HasPrefix(n, atomic.TempPrefix) {
			return false
		}
	}
	return true
}

// convertShard streams one .bin file's tensors into a safetensors file.
func convertShard(src, dst string) (keys []string, bytes int64, err error) {
	a, tensors, err := openBin(src)
	if err != nil {
		return nil, 0, err
	}
	defer a.Close()
	entries := make([]Entry, len(tensors))
	for i, t := range tensors {
		entries[i] = Entry{Name: t.key, DType: t.dtype, Shape: t.shape}
		keys = append(keys, t.key)
	}
	w, err := CreateSafetensors(dst, entries)
	if err != nil {
		return nil, 0, err
	}
	for _, t := range tensors {
		data, err := a.tensorBytes(t)
		if err == nil {
			err = w.Write(data)
		}
		if err != nil {
			w.Abort()
			return nil, 0, fmt.Errorf("%s: tensor %s: %w", src, t.key, err)
		}
		bytes += int64(len(data))
	}
	return keys, bytes, w.Close()
}

// tensorBytes reads a tensor's elements, row-major, from its storage.
func (a *binArchive) tensorBytes(t binTensor) ([]byte, error) {
	f := a.find("data/" + t.storage)
	if f == nil {
		return nil, fmt.Errorf("storage %s is missing from the archive", t.storage)
	}
	r, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	info, _ := dtype.FromSafetensors(t.dtype)
	size := int64(info.Bits / 8)
	storage, err := io.ReadAll(io.LimitReader(r, int64(f.UncompressedSize64)))
	if err != nil {
		return nil, err
	}
	return gather(storage, t.offset, t.shape, t.stride, size)
}

// gather copies a (possibly strided) view out of its storage.
func gather(storage []byte, offset int64, shape, stride []int64, size int64) ([]byte, error) {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	out := make([]byte, 0, n*size)
	idx := make([]int64, len(shape))
	for range n {
		at := offset
		for i, j := range idx {
			at += j * stride[i]
		}
		if at < 0 || (at+1)*size > int64(len(storage)) {
			return nil, fmt.Errorf("view reaches past its storage (%d bytes)", len(storage))
		}
		out = append(out, storage[at*size:(at+1)*size]...)
		for i := len(idx) - 1; i >= 0; i-- {
			idx[i]++
			if idx[i] < shape[i] {
				break
			}
			idx[i] = 0
		}
	}
	return out, nil
}

// finishConversion writes the index, copies the other files, and writes
// the marker last.
func finishConversion(src, dst string, weightMap map[string]string, total int64, shards int, c conversion) error {
	if shards > 1 {
		idx := map[string]any{"metadata": map[string]int64{"total_size": total}, "weight_map": weightMap}
		data, err := json.MarshalIndent(idx, "", "  ")
		if err != nil {
			return err
		}
		if err := atomic.WriteFile(filepath.Join(dst, indexFile), data); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && !strings.HasSuffix(n, ".bin") && n != binIndex && !strings.HasSuffix(n, ".safetensors") {
			data, err := os.ReadFile(filepath.Join(src, n))
			if err == nil {
				err = atomic.WriteFile(filepath.Join(dst, n), data)
			}
			if err != nil {
				return err
			}
		}
	}
	marker, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return atomic.WriteFile(filepath.Join(dst, ConvertedMarker), marker)
}
