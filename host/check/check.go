// Package check inspects an export directory as its loaders will: every
// model in it parses (streamed, never held whole), every external-data
// reference is a clean path inside the directory, a regular file, within
// its size, exactly a tensor of that file's own safetensors header and the
// one the weight spec (whose SHA-256 the model records) names; and it says
// which loaders
// accept the result: ONNX Runtime follows hard links but refuses data
// reached through a symlink out of the directory; the onnx package
// (onnx.load, onnx.checker) refuses any data file that is a symlink or has
// more than one link.
package check

import (
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/strata-llm/strata/sdk/dtype"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Loaders named in a Report.
const (
	ONNXRuntime = "onnxruntime"
	ONNXPackage = "onnx"
)

// Report is what Dir found.
type Report struct {
	Dir    string        `json:"dir"`
	Models []ModelReport `json:"models"`
	// Loaders says, per loader, whether it accepts every model, and why not.
	Loaders []Verdict `json:"loaders"`
	// Broken: a model does not parse, or its data is missing or short.
	Broken bool `json:"broken"`
}

// ModelReport is one .onnx file.
type ModelReport struct {
	Path      string     `json:"path"`
	Nodes     int        `json:"nodes"`
	Inputs    []string   `json:"inputs"`
	Outputs   []string   `json:"outputs"`
	Weights   int        `json:"external_weights"`
	DataFiles []DataFile `json:"data_files"`
	Problems  []string   `json:"problems,omitempty"`
}

// DataFile is one file external data points into.
type DataFile struct {
	Path    string `json:"path"` // relative to the model
	Bytes   int64  `json:"bytes"`
	Links   uint64 `json:"links"`   // hard links to the file
	Symlink bool   `json:"symlink"` // it, or a directory on its path, is a symlink
	Outside bool   `json:"outside"` // resolves outside the directory
}

// Verdict is one loader's.
type Verdict struct {
	Loader  string   `json:"loader"`
	Accepts bool     `json:"accepts"`
	Why     []string `json:"why,omitempty"`
}

// Dir checks every top-level .onnx of dir (model.onnx, separate models).
func Dir(dir string) (*Report, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.onnx"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s holds no .onnx model: give an export directory (strata export --out DIR)", dir)
	}
	sort.Strings(files)
	r := &Report{Dir: dir}
	for _, f := range files {
		m := checkModel(dir, f)
		r.Broken = r.Broken || len(m.Problems) > 0
		r.Models = append(r.Models, m)
	}
	r.Loaders = []Verdict{r.verdict(ONNXRuntime, ortRefuses), r.verdict(ONNXPackage, onnxRefuses)}
	return r, nil
}

func (r *Report) verdict(loader string, refuses func(DataFile) string) Verdict {
	v := Verdict{Loader: loader, Accepts: !r.Broken}
	if r.Broken {
		v.Why = append(v.Why, "the export is broken (see the problems above)")
	}
	for _, m := range r.Models {
		for _, f := range m.DataFiles {
			if why := refuses(f); why != "" {
				v.Accepts = false
				v.Why = append(v.Why, f.Path+": "+why)
			}
		}
	}
	return v
}

// ortRefuses: ONNX Runtime (≥ 1.24) refuses external data whose path,
// links resolved, leaves the model's directory.
func ortRefuses(f DataFile) string {
	if f.Outside {
		return "resolves outside the directory (a symlink): ONNX Runtime refuses it; re-export with --link hardlink, reflink or copy"
	}
	return ""
}

// onnxRefuses: the onnx package refuses data files that are symlinks or
// have several hard links (its guard against link attacks).
func onnxRefuses(f DataFile) string {
	switch {
	case f.Symlink:
		return "a symlink: the onnx package refuses it; re-export with --link copy (or reflink on btrfs/XFS)"
	case f.Links > 1:
		return fmt.Sprintf("has %d hard links: the onnx package refuses it; re-export with --link copy (or reflink on btrfs/XFS)", f.Links)
	}
	return ""
}

func checkModel(dir, path string) ModelReport {
	rel, _ := filepath.Rel(dir, path)
	m := ModelReport{Path: rel}
	g, err := readModel(path)
	if err != nil {
		m.Problems = append(m.Problems, err.Error())
		return m
	}
	m.Nodes, m.Inputs, m.Outputs = g.nodes, g.inputs, g.outputs
	if g.graphs == 0 || g.nodes == 0 || len(g.outputs) == 0 {
		m.Problems = append(m.Problems, fmt.Sprintf("%s holds no graph, or one without nodes or outputs (an empty or truncated file)", rel))
	}
	modelDir := filepath.Dir(path)
	sp, problems := readSpec(modelDir, g.metadata)
	m.Problems = append(m.Problems, problems...)
	refs := refsOf(sp)
	files := map[string]*dataRef{}
	for _, t := range g.initializers {
		if t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
			continue
		}
		m.Weights++
		ext, err := extent(t)
		if err != nil {
			m.Problems = append(m.Problems, err.Error())
			continue
		}
		f, ok := files[ext.loc]
		if !ok {
			f = openData(modelDir, dir, ext.loc)
			files[ext.loc] = f
			if f.problem != "" {
				m.Problems = append(m.Problems, f.problem)
			}
			m.DataFiles = append(m.DataFiles, f.DataFile)
		}
		if problem := f.check(t.GetName(), ext, refs[refKey{ext.loc, ext.offset}]); problem != "" {
			m.Problems = append(m.Problems, problem)
		}
	}
	if sp != nil {
		m.Problems = append(m.Problems, checkSpecFiles(sp, files)...)
	}
	return m
}

// external is where an external tensor's data is: length bytes at offset
// of the file at loc (relative to the model), which its dtype and dims need.
type external struct {
	loc            string
	offset, length int64
	need           int64 // -1: unknown (a dtype check does not size)
}

// extent reads an external tensor's reference and checks it is a clean
// path inside the directory and a byte range that holds the tensor.
func extent(t *onnxpb.TensorProto) (external, error) {
	e := external{need: -1}
	for _, kv := range t.GetExternalData() {
		var err error
		switch kv.GetKey() {
		case "location":
			e.loc = kv.GetValue()
		case "offset":
			e.offset, err = strconv.ParseInt(kv.GetValue(), 10, 64)
		case "length":
			e.length, err = strconv.ParseInt(kv.GetValue(), 10, 64)
		}
		if err != nil || e.offset < 0 || e.length < 0 {
			return e, fmt.Errorf("weight %s: bad external data %s=%q", t.GetName(), kv.GetKey(), kv.GetValue())
		}
	}
	// A clean relative path: "a/../b" would be resolved by a loader
	// through a's target, which a lexical check cannot see.
	if e.loc == "" || filepath.IsAbs(e.loc) || path.Clean(e.loc) != e.loc || !filepath.IsLocal(filepath.FromSlash(e.loc)) || slices.Contains(strings.Split(e.loc, "/"), "..") {
		return e, fmt.Errorf("weight %s: external data location %q is not a clean path inside the directory", t.GetName(), e.loc)
	}
	if e.offset > math.MaxInt64-e.length {
		return e, fmt.Errorf("weight %s: external data offset %d + length %d overflows", t.GetName(), e.offset, e.length)
	}
	if info, ok := dtype.Of(dtype.DType(t.GetDataType())); ok {
		n := int64(1)
		for _, d := range t.GetDims() {
			if d < 0 || d > 0 && n > math.MaxInt64/64/d {
				return e, fmt.Errorf("weight %s: dims %v are not a tensor's", t.GetName(), t.GetDims())
			}
			n *= d
		}
		e.need = info.ByteSize(n)
	}
	return e, nil
}

// dataFile describes location loc of a model in modelDir (inside dir).
func dataFile(modelDir, dir, loc string) (DataFile, string) {
	f := DataFile{Path: loc, Bytes: -1}
	p := filepath.Join(modelDir, filepath.FromSlash(loc))
	f.Symlink = throughSymlink(modelDir, loc)
	if real, err := filepath.EvalSymlinks(p); err == nil {
		real, _ = filepath.Abs(real)
		root, _ := filepath.EvalSymlinks(dir)
		root, _ = filepath.Abs(root)
		if rel, err := filepath.Rel(root, real); err != nil || !filepath.IsLocal(rel) {
			f.Outside = true
		}
	}
	info, err := os.Stat(p)
	switch {
	case err != nil:
		return f, fmt.Sprintf("%s: %v", loc, err)
	case !info.Mode().IsRegular():
		return f, fmt.Sprintf("%s is not a regular file", loc)
	}
	f.Bytes = info.Size()
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		f.Links = uint64(st.Nlink)
	}
	return f, ""
}

// throughSymlink reports whether any component of loc (under modelDir) is
// a symlink: the file itself, or a directory on the way to it.
func throughSymlink(modelDir, loc string) bool {
	p := modelDir
	for _, c := range strings.Split(loc, "/") {
		p = filepath.Join(p, c)
		if li, err := os.Lstat(p); err == nil && li.Mode()&os.ModeSymlink != 0 {
			return true
		}
	}
	return false
}

// Print writes the report as text.
func (r *Report) Print(w io.Writer) {
	for _, m := range r.Models {
		fmt.Fprintf(w, "%s: %d nodes, %d inputs, %d outputs, %d external weights in %d files%s\n",
			filepath.Join(r.Dir, m.Path), m.Nodes, len(m.Inputs), len(m.Outputs), m.Weights, len(m.DataFiles), kinds(m.DataFiles))
		for _, p := range m.Problems {
			fmt.Fprintf(w, "  problem: %s\n", p)
		}
	}
	for _, v := range r.Loaders {
		name := map[string]string{ONNXRuntime: "ONNX Runtime", ONNXPackage: "the onnx package (onnx.load, onnx.checker)"}[v.Loader]
		if v.Accepts {
			fmt.Fprintf(w, "%s: loads it\n", name)
			continue
		}
		fmt.Fprintf(w, "%s: refuses it\n", name)
		for i, why := range v.Why {
			if i == 3 {
				fmt.Fprintf(w, "  … and %d more\n", len(v.Why)-3)
				break
			}
			fmt.Fprintf(w, "  %s\n", why)
		}
	}
}

// kinds says how the data files are reached: " (2 hard-linked, 1 copy)".
func kinds(files []DataFile) string {
	n := map[string]int{}
	for _, f := range files {
		switch {
		case f.Symlink:
			n["symlinked"]++
		case f.Links > 1:
			n["hard-linked"]++
		case f.Bytes >= 0:
			n["single-link files"]++
		}
	}
	var parts []string
	for _, k := range []string{"single-link files", "hard-linked", "symlinked"} {
		if n[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[k], k))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
