package checkpoint

import (
	"archive/zip"
	"context"
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

	"github.com/strata-llm/strata/host/outdir"
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
// files), one tensor in memory at a time. dst must be new, empty, or an
// earlier conversion (strata's own files, by its manifest); a dst holding a
// complete conversion of the same source files is reused as it is. A
// conversion that fails or is cancelled leaves none of its files behind, so
// nothing in dst looks like a checkpoint.
func ConvertBin(ctx context.Context, src, dst string) (*Converted, error) {
	return ConvertBinWith(ctx, src, dst, BinOptions{})
}

// DefaultMaxAmplification is how many times the bytes of its storages a
// .bin file may write by default. Tensors sharing a storage are each
// written in full (safetensors has no views): tied embeddings double a few
// tensors, while 200,000 keys over one storage would turn megabytes into
// gigabytes.
const DefaultMaxAmplification = 4

// BinOptions tunes ConvertBinWith.
type BinOptions struct {
	// MaxAmplification bounds the tensor bytes written for each .bin file
	// to this multiple of its storages' bytes (0: the default).
	MaxAmplification float64
}

// ConvertBinWith is ConvertBin with options.
func ConvertBinWith(ctx context.Context, src, dst string, opts BinOptions) (res *Converted, err error) {
	if opts.MaxAmplification == 0 {
		opts.MaxAmplification = DefaultMaxAmplification
	}
	src, err = filepath.Abs(src)
	if err != nil {
		return nil, err
	}
	shards, err := binShards(src)
	if err != nil {
		return nil, err
	}
	want, sources, err := describeSource(src, shards)
	if err != nil {
		return nil, err
	}
	d, err := outdir.Open(ctx, dst, outdir.Options{Tool: "convert-bin", Sources: sources})
	if err != nil {
		return nil, fmt.Errorf("conversion: %w", err)
	}
	defer func() {
		if err == nil {
			err = d.Close()
			return
		}
		if d.Created() {
			d.Discard()
			return
		}
		d.RemoveAll(".")
		d.Close()
	}()
	if reused(d, want) {
		return &Converted{Dir: dst, Reused: true, Shards: len(shards)}, nil
	}
	// An earlier conversion, finished or not: strata's files go.
	if err := d.RemoveAll("."); err != nil {
		return nil, err
	}
	res = &Converted{Dir: dst, Shards: len(shards)}
	weightMap := map[string]string{}
	var total int64
	for _, shard := range shards {
		out := safetensorsName(shard, len(shards))
		keys, bytes, err := convertShard(ctx, filepath.Join(src, shard), d, out, opts.MaxAmplification)
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
	if err := finishConversion(ctx, src, d, weightMap, total, len(shards), want); err != nil {
		return nil, err
	}
	return res, nil
}

// binShards lists the .bin files: those the index names, or the single one.
func binShards(src string) ([]string, error) {
	data, err := readRegular(filepath.Join(src, binIndex), maxJSONBytes)
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

// describeSource records the source files (for reuse) and lists what the
// output directory must keep clear of: src and each shard, symlinks resolved.
func describeSource(src string, shards []string) (conversion, []string, error) {
	c := conversion{Source: src}
	sources := []string{src}
	for _, name := range shards {
		real, info, err := Resolve(filepath.Join(src, name))
		if err != nil {
			return c, nil, fmt.Errorf("%s names %s: %w", src, name, err)
		}
		sources = append(sources, real)
		c.Files = append(c.Files, sourceFile{Name: name, Size: info.Size(), ModTime: info.ModTime().UnixNano()})
	}
	return c, sources, nil
}

// reused reports whether d holds strata's complete conversion of want.
func reused(d *outdir.Dir, want conversion) bool {
	if !d.Owned(ConvertedMarker) {
		return false
	}
	data, err := d.ReadFile(ConvertedMarker)
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

// convertShard streams one .bin file's tensors into a safetensors file.
func convertShard(ctx context.Context, src string, d *outdir.Dir, dst string, maxAmplification float64) (keys []string, bytes int64, err error) {
	a, tensors, err := openBin(src)
	if err != nil {
		return nil, 0, err
	}
	defer a.Close()
	if err := a.checkAmplification(tensors, maxAmplification); err != nil {
		return nil, 0, err
	}
	entries := make([]Entry, len(tensors))
	for i, t := range tensors {
		entries[i] = Entry{Name: t.key, DType: t.dtype, Shape: t.shape}
		keys = append(keys, t.key)
	}
	f, err := d.Create(dst)
	if err != nil {
		return nil, 0, err
	}
	w, err := NewWriter(d.Join(dst), CancelSink(ctx, f), entries)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", src, err)
	}
	for _, t := range tensors {
		if err := ctx.Err(); err != nil {
			w.Abort()
			return nil, 0, err
		}
		data, err := a.tensorBytes(ctx, t)
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

// storage finds a tensor's storage in the archive and its element size.
func (a *binArchive) storage(t binTensor) (*zip.File, int64, error) {
	f := a.find("data/" + t.storage)
	if f == nil {
		return nil, 0, fmt.Errorf("storage %s is missing from the archive", t.storage)
	}
	if f.Method != zip.Store {
		return nil, 0, fmt.Errorf("storage %s is compressed (zip method %d); torch.save stores storages uncompressed: the file is not a torch.save archive", t.storage, f.Method)
	}
	info, _ := dtype.FromSafetensors(t.dtype)
	size := int64(info.Bits / 8)
	if size <= 0 {
		return nil, 0, fmt.Errorf("storage %s: dtype %s has no whole-byte size", t.storage, t.dtype)
	}
	if f.UncompressedSize64 > uint64(math.MaxInt64) || f.UncompressedSize64 != f.CompressedSize64 {
		return nil, 0, fmt.Errorf("storage %s: inconsistent sizes in the archive", t.storage)
	}
	return f, size, nil
}

// tensorBytes reads a tensor's elements, row-major, from its storage. The
// view is checked against the storage's size before anything is allocated,
// and only the span of the storage it reaches is read: a checkpoint whose
// tensors are views of one flat storage reads each byte once, not the whole
// storage per tensor.
func (a *binArchive) tensorBytes(ctx context.Context, t binTensor) ([]byte, error) {
	f, size, err := a.storage(t)
	if err != nil {
		return nil, err
	}
	n, reach, err := checkView(t, int64(f.UncompressedSize64)/size)
	if err != nil || n == 0 {
		return []byte{}, err
	}
	at, err := f.DataOffset()
	if err != nil {
		return nil, fmt.Errorf("storage %s: %w", t.storage, err)
	}
	span := make([]byte, (reach-t.offset+1)*size)
	if _, err := a.r.ReadAt(span, at+t.offset*size); err != nil {
		return nil, fmt.Errorf("reading storage %s: %w", t.storage, err)
	}
	return gather(ctx, span, 0, t.shape, t.stride, size)
}

// maxDims bounds a tensor's rank (PyTorch allows 64).
const maxDims = 64

// checkView validates a tensor view against its storage of storageElems
// elements, with overflow checks, and returns its element count and the
// last element it reaches: non-negative shape, strides and offset, and
// every element it reaches inside the storage. Any strides are accepted
// and written as torch reads them, each element in full: stride 0 (an
// expand()ed buffer), overlapping rows (as_strided, unfold), transposes:
// torch loads them, so refusing them would refuse checkpoints torch reads.
// What that writes is bounded for the whole file by checkAmplification.
func checkView(t binTensor, storageElems int64) (n, reach int64, err error) {
	if len(t.shape) > maxDims || len(t.shape) != len(t.stride) {
		return 0, 0, fmt.Errorf("tensor view of rank %d with %d strides", len(t.shape), len(t.stride))
	}
	if t.offset < 0 {
		return 0, 0, fmt.Errorf("negative storage offset %d", t.offset)
	}
	n, reach = 1, t.offset
	for i, d := range t.shape {
		s := t.stride[i]
		if d < 0 || s < 0 {
			return 0, 0, fmt.Errorf("negative size or stride in shape %v, stride %v", t.shape, t.stride)
		}
		if d != 0 && n > math.MaxInt64/d {
			return 0, 0, fmt.Errorf("shape %v has too many elements", t.shape)
		}
		n *= d
		if d > 0 {
			if s != 0 && d-1 > (math.MaxInt64-reach)/s {
				return 0, 0, fmt.Errorf("shape %v with stride %v reaches past any storage", t.shape, t.stride)
			}
			reach += (d - 1) * s
		}
	}
	if n == 0 {
		return 0, 0, nil
	}
	if reach >= storageElems {
		return 0, 0, fmt.Errorf("view (offset %d, shape %v, stride %v) reaches element %d of a storage of %d elements", t.offset, t.shape, t.stride, reach, storageElems)
	}
	return n, reach, nil
}

// gather copies a (possibly strided) view, checked by checkView, out of its
// storage.
func gather(ctx context.Context, storage []byte, offset int64, shape, stride []int64, size int64) ([]byte, error) {
	n := int64(1)
	contiguous, want := true, int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		n *= shape[i]
		if shape[i] != 1 && stride[i] != want {
			contiguous = false
		}
		want *= shape[i]
	}
	if contiguous || n == 0 {
		if offset < 0 || n > 0 && (offset+n)*size > int64(len(storage)) {
			return nil, fmt.Errorf("view reaches past its storage (%d bytes)", len(storage))
		}
		out := make([]byte, n*size)
		copy(out, storage[offset*size:])
		return out, nil
	}
	out := make([]byte, 0, n*size)
	idx := make([]int64, len(shape))
	for k := range n {
		if k%(1<<20) == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
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

// finishConversion writes the index, copies the other files (regular
// files, symlinks resolved: a Hugging Face cache's config.json is a link),
// and writes the marker last.
func finishConversion(ctx context.Context, src string, d *outdir.Dir, weightMap map[string]string, total int64, shards int, c conversion) error {
	if shards > 1 {
		idx := map[string]any{"metadata": map[string]int64{"total_size": total}, "weight_map": weightMap}
		data, err := json.MarshalIndent(idx, "", "  ")
		if err != nil {
			return err
		}
		if err := d.WriteFile(indexFile, data); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		if strings.HasSuffix(n, ".bin") || n == binIndex || strings.HasSuffix(n, ".safetensors") || n == ConvertedMarker || strings.HasPrefix(n, ".strata-") {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := os.Stat(filepath.Join(src, n))
		if err != nil || !info.Mode().IsRegular() {
			continue // directories, dangling links and special files are not copied
		}
		data, err := readRegular(filepath.Join(src, n), maxJSONBytes)
		if err == nil {
			err = d.WriteFile(n, data)
		}
		if err != nil {
			return err
		}
	}
	marker, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return d.WriteFile(ConvertedMarker, marker)
}
