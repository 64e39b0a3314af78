// Package check inspects an export directory as its loaders will: every
// model in it parses, every external-data reference lands inside the
// directory, in a regular file, within its size; and it says which loaders
// accept the result: ONNX Runtime follows hard links but refuses data
// reached through a symlink out of the directory; the onnx package
// (onnx.load, onnx.checker) refuses any data file that is a symlink or has
// more than one link.
package check

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/strata-llm/strata/host/compile"
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
	Links   uint64 `json:"links"` // hard links to the file
	Symlink bool   `json:"symlink"`
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
	g, err := readGraph(path)
	if err != nil {
		m.Problems = append(m.Problems, err.Error())
		return m
	}
	m.Nodes = len(g.GetNode())
	for _, in := range g.GetInput() {
		m.Inputs = append(m.Inputs, in.GetName())
	}
	for _, out := range g.GetOutput() {
		m.Outputs = append(m.Outputs, out.GetName())
	}
	seen := map[string]int{}
	for _, t := range g.GetInitializer() {
		if t.GetDataLocation() != onnxpb.TensorProto_EXTERNAL {
			continue
		}
		m.Weights++
		loc, end, err := extent(t)
		if err != nil {
			m.Problems = append(m.Problems, err.Error())
			continue
		}
		i, ok := seen[loc]
		if !ok {
			f, problem := dataFile(filepath.Dir(path), dir, loc)
			if problem != "" {
				m.Problems = append(m.Problems, problem)
			}
			i = len(m.DataFiles)
			seen[loc] = i
			m.DataFiles = append(m.DataFiles, f)
		}
		if f := m.DataFiles[i]; f.Bytes >= 0 && end > f.Bytes {
			m.Problems = append(m.Problems, fmt.Sprintf("weight %s ends at byte %d of %s, which has %d", t.GetName(), end, loc, f.Bytes))
		}
	}
	return m
}

func readGraph(path string) (*onnxpb.GraphProto, error) {
	m, err := compile.ReadProto(path)
	if err != nil {
		return nil, err
	}
	return m.GetGraph(), nil
}

// extent is an external tensor's location and the byte its data ends at.
func extent(t *onnxpb.TensorProto) (string, int64, error) {
	var loc string
	var offset, length int64
	for _, e := range t.GetExternalData() {
		var err error
		switch e.GetKey() {
		case "location":
			loc = e.GetValue()
		case "offset":
			offset, err = strconv.ParseInt(e.GetValue(), 10, 64)
		case "length":
			length, err = strconv.ParseInt(e.GetValue(), 10, 64)
		}
		if err != nil || offset < 0 || length < 0 {
			return "", 0, fmt.Errorf("weight %s: bad external data %s=%q", t.GetName(), e.GetKey(), e.GetValue())
		}
	}
	if loc == "" || filepath.IsAbs(loc) || !filepath.IsLocal(filepath.FromSlash(loc)) {
		return "", 0, fmt.Errorf("weight %s: external data location %q is not a path inside the directory", t.GetName(), loc)
	}
	return loc, offset + length, nil
}

// dataFile describes location loc of a model in modelDir (inside dir).
func dataFile(modelDir, dir, loc string) (DataFile, string) {
	f := DataFile{Path: loc, Bytes: -1}
	p := filepath.Join(modelDir, filepath.FromSlash(loc))
	if li, err := os.Lstat(p); err == nil && li.Mode()&os.ModeSymlink != 0 {
		f.Symlink = true
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		root, _ := filepath.EvalSymlinks(dir)
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
