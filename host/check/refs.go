package check

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"slices"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/sdk/dtype"
)

// maxSpecBytes bounds a weight spec read whole (GLM-4.6's is 9 MB).
const maxSpecBytes = 1 << 30

// readSpec is the weight spec a model records in its metadata: whole (a
// window), or by reference to a file beside it whose SHA-256 it records
// (model.onnx). None: the model is not strata's, there is nothing to hold
// its references against. A spec file missing or changed is a problem,
// and then no spec.
func readSpec(modelDir string, metadata map[string]string) (*weights.Spec, []string) {
	v, ok := metadata[weights.MetadataKey]
	if !ok {
		return nil, nil
	}
	var ref weights.SpecReference
	if json.Unmarshal([]byte(v), &ref) == nil && ref.Path != "" {
		return readSpecFile(modelDir, ref)
	}
	sp, err := weights.ParseSpec([]byte(v))
	if err != nil {
		return nil, []string{fmt.Sprintf("the weight spec in the model's metadata: %v", err)}
	}
	return sp, nil
}

func readSpecFile(modelDir string, ref weights.SpecReference) (*weights.Spec, []string) {
	if path.Clean(ref.Path) != ref.Path || !filepath.IsLocal(filepath.FromSlash(ref.Path)) {
		return nil, []string{fmt.Sprintf("the model names its weight spec %q, not a clean path inside the directory", ref.Path)}
	}
	f, _, err := checkpoint.OpenRegular(filepath.Join(modelDir, filepath.FromSlash(ref.Path)))
	if err != nil {
		return nil, []string{fmt.Sprintf("%s, the weight spec the model records, cannot be read: %v", ref.Path, err)}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSpecBytes))
	if err != nil {
		return nil, []string{fmt.Sprintf("reading %s: %v", ref.Path, err)}
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != ref.SHA256 {
		return nil, []string{fmt.Sprintf("%s changed since the export (sha256 %.12s…, the model records %.12s…): it no longer describes the model's weights", ref.Path, got, ref.SHA256)}
	}
	sp, err := weights.ParseSpec(data)
	if err != nil {
		return nil, []string{fmt.Sprintf("%s: %v", ref.Path, err)}
	}
	return sp, nil
}

// refKey is a byte range's start in a data file (relative to the model).
type refKey struct {
	loc    string
	offset int64
}

// specRef is what the weight spec says lies at a byte range: a tensor of
// this key ("" for a materialised weight, whose name the spec does not
// record as a header key), dtype (safetensors name) and shape.
type specRef struct {
	key, dtype string
	shape      []int64
}

// refsOf indexes the spec's byte ranges by file and offset.
func refsOf(sp *weights.Spec) map[refKey]*specRef {
	refs := map[refKey]*specRef{}
	if sp == nil {
		return refs
	}
	file := func(i int) string {
		if i < 0 || i >= len(sp.Files) {
			return ""
		}
		return sp.Files[i].Path
	}
	for _, w := range sp.Weights {
		for _, s := range w.Sources {
			refs[refKey{file(s.File), s.Offset}] = &specRef{key: s.Key, dtype: s.DType, shape: s.Shape}
		}
		if w.Data != nil {
			r := &specRef{shape: w.Shape}
			if t, err := dtype.Parse(w.DType); err == nil {
				info, _ := dtype.Of(t)
				r.dtype = info.Safetensors
			}
			refs[refKey{file(w.Data.File), w.Data.Offset}] = r
		}
	}
	return refs
}

// dataRef is a data file the model's external data points into, with its
// safetensors header's tensors by absolute offset (nil: not safetensors).
type dataRef struct {
	DataFile
	problem   string
	tensors   map[int64]checkpoint.Tensor
	headerErr error
}

func openData(modelDir, dir, loc string) *dataRef {
	f, problem := dataFile(modelDir, dir, loc)
	d := &dataRef{DataFile: f, problem: problem}
	if problem != "" {
		return d
	}
	sh, err := checkpoint.ReadShard(filepath.Join(modelDir, filepath.FromSlash(loc)), loc)
	if err != nil {
		d.headerErr = err
		return d
	}
	d.tensors = make(map[int64]checkpoint.Tensor, len(sh.Tensors))
	for _, t := range sh.Tensors {
		d.tensors[t.Offset] = t
	}
	return d
}

// check holds one weight's reference against the file: within it, as
// long as its dtype and dims need, exactly a tensor of the file's own
// header, and that tensor the one the weight spec names.
func (d *dataRef) check(name string, e external, ref *specRef) string {
	switch {
	case d.problem != "":
		return "" // reported once, for the file
	case e.offset+e.length > d.Bytes:
		return fmt.Sprintf("weight %s ends at byte %d of %s, which has %d", name, e.offset+e.length, e.loc, d.Bytes)
	case e.need >= 0 && e.length != e.need:
		return fmt.Sprintf("weight %s: its dtype and dims need %d bytes, its external data gives %d", name, e.need, e.length)
	case d.tensors == nil && ref != nil:
		return fmt.Sprintf("weight %s: %s, which the weight spec names, is not a safetensors file: %v", name, e.loc, d.headerErr)
	case d.tensors == nil:
		return "" // another exporter's data file: nothing more to hold it against
	}
	t, ok := d.tensors[e.offset]
	if !ok || t.Length != e.length {
		return fmt.Sprintf("weight %s: bytes %d-%d of %s are no tensor of that file's safetensors header: the file was swapped or replaced, or the model edited", name, e.offset, e.offset+e.length, e.loc)
	}
	if ref == nil {
		return ""
	}
	if ref.key != "" && t.Key != ref.key || ref.dtype != "" && t.DType != ref.dtype || ref.shape != nil && !slices.Equal(t.Shape, ref.shape) {
		want := ref.key
		if want == "" {
			want = "a weight"
		}
		return fmt.Sprintf("weight %s: %s holds %s (%s %v) at byte %d, where the weight spec says %s (%s %v): the file was swapped or replaced",
			name, e.loc, t.Key, t.DType, t.Shape, e.offset, want, ref.dtype, ref.shape)
	}
	return ""
}

// checkSpecFiles holds the data files against the sizes the spec records.
func checkSpecFiles(sp *weights.Spec, files map[string]*dataRef) []string {
	var problems []string
	for _, f := range sp.Files {
		if d, ok := files[f.Path]; ok && d.problem == "" && f.Size > 0 && d.Bytes != f.Size {
			problems = append(problems, fmt.Sprintf("%s has %d bytes, the weight spec recorded %d: the file was replaced or changed", f.Path, d.Bytes, f.Size))
		}
	}
	return problems
}
