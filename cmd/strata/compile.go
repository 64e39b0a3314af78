package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/strata-llm/strata/host/compile"
	"github.com/strata-llm/strata/host/export"
	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/host/window"
)

func compileCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "out", Aliases: []string{"o"}, Required: true, Usage: "compile `DIR` (a checkpoint is exported into DIR/export first)"},
		jsonFlag(),
		&cli.StringFlag{Name: "backend", Value: "qaic", Usage: "qaic (qaic-compile) or ort (ONNX Runtime's optimiser)"},
		&cli.BoolFlag{Name: "dry-run", Usage: "qaic: write specializations.json, custom_io.yaml and compile.sh, do not run the compiler"},
		&cli.StringFlag{Name: "compiler", Usage: "qaic: qaic-compile `PATH` (default: on PATH, else " + compile.DefaultCompiler + ")"},
		&cli.IntFlag{Name: "batch-size", Value: 1, Usage: "qaic: batch size"},
		&cli.IntFlag{Name: "prefill-seq-len", Value: 32, Usage: "qaic: prefill sequence length"},
		&cli.IntFlag{Name: "ctx-len", Value: 128, Usage: "qaic: context length"},
		&cli.IntFlag{Name: "full-batch-size", Usage: "qaic: continuous-batching decode batch size"},
		&cli.IntFlag{Name: "kv-cache-batch-size", Usage: "qaic: continuous-batching KV-cache rows (default: --full-batch-size)"},
		&cli.IntSliceFlag{Name: "comp-ctx-lengths-prefill", Usage: "qaic: compute-context lengths of the prefill specializations (CCL export)"},
		&cli.IntSliceFlag{Name: "comp-ctx-lengths-decode", Usage: "qaic: compute-context lengths of the decode specializations (CCL export)"},
		&cli.IntFlag{Name: "num-cores", Value: 16, Usage: "qaic: -aic-num-cores"},
		&cli.IntFlag{Name: "num-devices", Value: 1, Usage: "qaic: devices; more than 1 writes the tensor-slicing partition config"},
		&cli.BoolFlag{Name: "mxfp6-matmul", Usage: "qaic: -mxfp6-matmul (MXFP6 weight compression)"},
		&cli.BoolFlag{Name: "mxint8-kv-cache", Usage: "qaic: KV cache in MXINT8 (a custom-IO precision)"},
		&cli.IntFlag{Name: "mos", Usage: "qaic: -mos=N effort to reduce on-chip memory"},
		&cli.BoolFlag{Name: "aic-enable-depth-first", Usage: "qaic: -aic-enable-depth-first"},
		&cli.BoolFlag{Name: "split-retained-state-io", Usage: "qaic: -split-retained-state-io"},
		&cli.StringFlag{Name: "aic-hw-version", Usage: "qaic: ai100 or ai200 (default: read from qaic-util, else ai100)"},
		&cli.StringSliceFlag{Name: "compiler-flag", Usage: "qaic: pass `FLAG` to qaic-compile as given (repeatable), e.g. --compiler-flag=-user-tiled"},
		&cli.BoolFlag{Name: "compile-per-window", Usage: "qaic: compile each window model of a --layerwise --keep-windows export on its own (-j at once)"},
		&cli.StringFlag{Name: "ort-level", Value: "extended", Usage: "ort: graph optimisation level: basic, extended, all"},
		&cli.BoolFlag{Name: "ort-format", Usage: "ort: also save the ORT format (when the model allows it)"},
		&cli.StringFlag{Name: "python", Value: "python3", Usage: "ort: a Python with onnxruntime"},
	}
	return &cli.Command{
		Name:        "compile",
		Usage:       "compile an export (or a checkpoint, exported first) with qaic-compile or ONNX Runtime",
		ArgsUsage:   "MODEL|EXPORT_DIR",
		Description: modelHelp + "\nAn EXPORT_DIR (a directory holding model.onnx) is compiled as it is.",
		Flags:       append(flags, exportFlags()...),
		Action: func(c *cli.Context) (err error) {
			src, err := oneArg(c, "MODEL|EXPORT_DIR")
			if err != nil {
				return err
			}
			if _, err := outFlag(c); err != nil {
				return err
			}
			if err := checkCompileFlags(c, flags); err != nil {
				return err
			}
			d, err := openCompileDir(c, src)
			if err != nil {
				return err
			}
			defer func() {
				if err != nil && d.Created() && len(d.Files(".")) == 0 && !d.Owned(exportSubdir) {
					d.Discard() // refused before writing anything: leave no directory
					return
				}
				d.Close()
			}()
			start := time.Now()
			exportDir, exported, err := exportForCompile(c, d, src)
			if err != nil {
				return err
			}
			model, err := compile.ReadModel(filepath.Join(exportDir, export.ModelFile))
			if err != nil {
				return err
			}
			extras, err := extraModels(c, exportDir)
			if err != nil {
				return err
			}
			var ortReport *compile.ORTReport
			if c.String("backend") == "ort" {
				if ortReport, err = compileORT(c, d, model, "."); err == nil {
					for _, x := range extras {
						if _, err = compileORT(c, d, x.model, x.name); err != nil {
							break
						}
					}
				}
			} else {
				err = compileQAIC(c, d, model, exportDir, extras)
			}
			if err != nil || !c.Bool("json") {
				return err
			}
			return emitJSON(c, summarizeCompile(c, start, exportDir, exported, ortReport))
		},
	}
}

// checkCompileFlags checks, before any export, what needs no model: the
// backend, that no flag of the other backend is given, the qaic values, and
// that the compiler (or ONNX Runtime's Python) is there.
func checkCompileFlags(c *cli.Context, flags []cli.Flag) error {
	backend := c.String("backend")
	if backend != "qaic" && backend != "ort" {
		return usageError{fmt.Sprintf("unknown --backend %q: use qaic or ort", backend)}
	}
	var wrong []string
	for _, f := range flags {
		usage := f.(cli.DocGenerationFlag).GetUsage()
		prefix, _, _ := strings.Cut(usage, ":")
		if (prefix == "qaic" || prefix == "ort") && prefix != backend && c.IsSet(f.Names()[0]) {
			wrong = append(wrong, "--"+f.Names()[0])
		}
	}
	if len(wrong) > 0 {
		other := map[string]string{"qaic": "ort", "ort": "qaic"}[backend]
		return usageError{fmt.Sprintf("%s: only for --backend %s, but the backend is %s", strings.Join(wrong, ", "), other, backend)}
	}
	if backend == "ort" {
		return compile.CheckORT(c.Context, compile.ORT{Level: c.String("ort-level"), Python: c.String("python")})
	}
	if err := qaicOptions(c).CheckFlags(); err != nil {
		return usageError{err.Error()}
	}
	if !c.Bool("dry-run") {
		if _, err := compile.FindCompiler(c.String("compiler")); err != nil {
			return err
		}
	}
	return nil
}

// openCompileDir opens --out as strata's (host/outdir): compile replaces
// and deletes there only what it wrote itself, the export it made lives in
// export/ under a manifest of its own, and the compiler's binary directory
// is adopted whole once the compiler succeeds.
func openCompileDir(c *cli.Context, src string) (*outdir.Dir, error) {
	var sources []string
	if _, err := os.Stat(src); err == nil && !sameFile(src, filepath.Join(c.String("out"), exportSubdir)) {
		// (OUT/export is compile's own export, compiled again as it is:
		// compile writes beside it, never in it.)
		sources = append(sources, src)
	}
	return outdir.Open(c.Context, c.String("out"), outdir.Options{Tool: "compile", Sources: sources})
}

// exportForCompile returns the export to compile: src itself when it is one
// (export options then make no sense), else src exported into OUT/export.
func exportForCompile(c *cli.Context, d *outdir.Dir, src string) (string, *exportSummary, error) {
	isExport := fileExists(filepath.Join(src, export.ModelFile))
	if isExport {
		for _, f := range exportFlags() {
			if name := f.Names()[0]; c.IsSet(name) && name != "subfunctions" && name != "jobs" {
				return "", nil, usageError{fmt.Sprintf("--%s is an export option, but %s is already an export; give a checkpoint to export and compile", name, src)}
			}
		}
		return src, nil, nil
	}
	if err := d.MkdirTree(exportSubdir); err != nil {
		return "", nil, err
	}
	out := d.Join(exportSubdir)
	opts, err := exportOptions(c, out)
	if err != nil {
		return "", nil, err
	}
	if c.Bool("compile-per-window") {
		opts.Layerwise, opts.KeepWindows = true, true
	}
	_, summary, err := runExport(c, src, opts)
	return out, summary, err
}

// compileSummary is compile's --json result.
type compileSummary struct {
	Command string `json:"command"`
	Backend string `json:"backend"`
	Out     string `json:"out"`
	// ExportDir is the export compiled; Export its summary when compile
	// exported the checkpoint first.
	ExportDir string         `json:"export_dir"`
	Export    *exportSummary `json:"export,omitempty"`
	DryRun    bool           `json:"dry_run"`
	// Binaries are the compiled program directories (qaic).
	Binaries []string           `json:"binaries,omitempty"`
	ORT      *compile.ORTReport `json:"ort,omitempty"`
	Files    []writtenRef       `json:"files"`
	Seconds  float64            `json:"seconds"`
}

func summarizeCompile(c *cli.Context, start time.Time, exportDir string, exported *exportSummary, ortReport *compile.ORTReport) *compileSummary {
	out := c.String("out")
	s := &compileSummary{Command: "compile", Backend: c.String("backend"), Out: out, ExportDir: exportDir, Export: exported,
		DryRun: c.Bool("dry-run"), ORT: ortReport, Files: []writtenRef{}}
	skip := filepath.Join(out, exportSubdir)
	filepath.WalkDir(out, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return nil
		case d.IsDir() && (path == skip || strings.HasPrefix(d.Name(), ".strata-")):
			return filepath.SkipDir
		case d.IsDir() && d.Name() == compile.BinaryDir:
			s.Binaries = append(s.Binaries, path)
		case d.Type().IsRegular() && !strings.HasPrefix(d.Name(), ".strata-"):
			if info, err := d.Info(); err == nil {
				s.Files = append(s.Files, writtenRef{Path: path, Bytes: info.Size(), What: "compile"})
			}
		}
		return nil
	})
	s.Seconds = time.Since(start).Seconds()
	return s
}

// sameFile reports whether a and b are one file or directory.
func sameFile(a, b string) bool {
	ia, err1 := os.Stat(a)
	ib, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(ia, ib)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func qaicOptions(c *cli.Context) compile.QAIC {
	o := compile.QAIC{
		BatchSize: c.Int("batch-size"), PrefillSeqLen: c.Int("prefill-seq-len"), CtxLen: c.Int("ctx-len"),
		FullBatchSize: c.Int("full-batch-size"), KVCacheBatchSize: c.Int("kv-cache-batch-size"),
		CCLPrefill: c.IntSlice("comp-ctx-lengths-prefill"), CCLDecode: c.IntSlice("comp-ctx-lengths-decode"),
		NumCores: c.Int("num-cores"), NumDevices: c.Int("num-devices"),
		MXFP6Matmul: c.Bool("mxfp6-matmul"), MXINT8KVCache: c.Bool("mxint8-kv-cache"), MOS: c.Int("mos"),
		DepthFirst: c.Bool("aic-enable-depth-first"), SplitRetained: c.Bool("split-retained-state-io"),
		HWVersion: c.String("aic-hw-version"), Subfunctions: c.Bool("subfunctions"), Extra: c.StringSlice("compiler-flag"),
	}
	if o.HWVersion == "" {
		o.HWVersion = detectHWVersion()
	}
	return o
}

// detectHWVersion reads the first device's firmware variant from qaic-util,
// as the reference toolchain does: AIC200 means ai200, anything else ai100.
func detectHWVersion() string {
	out, err := exec.Command("/opt/qti-aic/tools/qaic-util", "-q").Output()
	if err != nil {
		return "ai100"
	}
	if m := regexp.MustCompile(`FW IMAGE_VARIANT\s*:\s*(\S+)`).FindSubmatch(out); m != nil && strings.Contains(strings.ToUpper(string(m[1])), "AIC200") {
		return "ai200"
	}
	return "ai100"
}

// exportSubdir is where compile exports a checkpoint it is given.
const exportSubdir = "export"

// extraModel is a separate model of the export compiled beside model.onnx,
// into OUT/<name>/ (glm's MTP draft mtp.onnx).
type extraModel struct {
	name  string
	model *compile.Model
}

// extraModels lists the export's other decoder models: every top-level
// <name>.onnx with a KV cache. One without (a vision encoder) is not
// compiled with a decoder's specialisations: compile says so and goes on.
func extraModels(c *cli.Context, exportDir string) ([]extraModel, error) {
	files, err := filepath.Glob(filepath.Join(exportDir, "*.onnx"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []extraModel
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".onnx")
		if filepath.Base(f) == export.ModelFile {
			continue
		}
		m, err := compile.ReadModel(f)
		if err != nil {
			return nil, err
		}
		if len(m.Caches) == 0 {
			note(c, "%s is not compiled: it has no KV cache, and compile builds a decoder's prefill and decode specialisations", filepath.Base(f))
			continue
		}
		out = append(out, extraModel{name: name, model: m})
	}
	return out, nil
}

func compileQAIC(c *cli.Context, d *outdir.Dir, model *compile.Model, exportDir string, extras []extraModel) error {
	o := qaicOptions(c)
	compiler := c.String("compiler")
	if !c.Bool("dry-run") {
		var err error
		if compiler, err = compile.FindCompiler(compiler); err != nil {
			return err
		}
	} else if compiler == "" {
		compiler = compile.DefaultCompiler
	}
	script := scriptCompiler(c, compiler)
	if c.Bool("compile-per-window") {
		if err := compileWindows(c, d, exportDir, o, compiler, script); err != nil {
			return err
		}
	} else if err := compileQAICModel(c, d, model, ".", o, compiler, script); err != nil {
		return err
	}
	for _, x := range extras {
		if err := compileQAICModel(c, d, x.model, x.name, o, compiler, script); err != nil {
			return fmt.Errorf("%s.onnx: %w", x.name, err)
		}
	}
	return nil
}

// compileQAICModel compiles one model into directory rel of d.
func compileQAICModel(c *cli.Context, d *outdir.Dir, model *compile.Model, rel string, o compile.QAIC, compiler, script string) error {
	job, err := compile.PlanQAIC(model, d.Join(rel), o)
	if err != nil {
		return err
	}
	if err := job.Write(d, rel, script); err != nil {
		return err
	}
	for _, n := range job.Notes {
		note(c, "%s", n)
	}
	scriptPath := filepath.Join(job.Dir, compile.ScriptFile)
	if c.Bool("dry-run") {
		fmt.Fprintf(textOut(c), "wrote %s, %s, %s in %s (dry run: the compiler did not run)\n",
			compile.SpecializationsFile, compile.CustomIOFile, compile.ScriptFile, job.Dir)
		return nil
	}
	fmt.Fprintf(textOut(c), "$ %s (see %s)\n", compiler, scriptPath)
	compilerOut := c.App.Writer
	if c.Bool("json") || c.Path("stats") == "-" { // stdout holds only JSON
		compilerOut = c.App.ErrWriter
	}
	if err := runJob(c.Context, d, rel, job, compiler, compilerOut, c.App.ErrWriter); err != nil {
		return err
	}
	fmt.Fprintf(textOut(c), "compiled to %s\n", filepath.Join(job.Dir, compile.BinaryDir))
	return nil
}

// scriptCompiler is the compiler compile.sh names: the SDK's location when
// that is the one found, else qaic-compile (looked up on PATH when the script
// runs; QAIC_COMPILE overrides it): no path of this machine in the script.
func scriptCompiler(_ *cli.Context, found string) string {
	if found == compile.DefaultCompiler {
		return found
	}
	return "qaic-compile"
}

// compileWindows compiles every window model of the export on its own, in
// OUT/windows/window_<first>_<last>/, -j at once; each compiler's output goes
// to its compile.log.
func compileWindows(c *cli.Context, d *outdir.Dir, exportDir string, o compile.QAIC, compiler, script string) error {
	files, err := filepath.Glob(filepath.Join(exportDir, window.Dir, "window_*.onnx"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("%s has no window models: export with --layerwise --keep-windows (or give a checkpoint)", exportDir)
	}
	sort.Slice(files, func(i, j int) bool { return windowFirst(files[i]) < windowFirst(files[j]) })
	jobs := make([]*compile.Job, len(files))
	rels := make([]string, len(files))
	for i, f := range files {
		m, err := compile.ReadModel(f)
		if err != nil {
			return err
		}
		rels[i] = window.Dir + "/" + strings.TrimSuffix(filepath.Base(f), ".onnx")
		if jobs[i], err = compile.PlanQAIC(m, d.Join(rels[i]), o); err != nil {
			return err
		}
		if err := jobs[i].Write(d, rels[i], script); err != nil {
			return err
		}
	}
	if c.Bool("dry-run") {
		fmt.Fprintf(textOut(c), "wrote the compile files of %s in %s (dry run)\n", plural(len(jobs), "window"), filepath.Join(c.String("out"), window.Dir))
		return nil
	}
	return runJobs(c, d, jobs, rels, compiler)
}

func windowFirst(path string) int {
	var first, last int
	fmt.Sscanf(filepath.Base(path), "window_%d_%d.onnx", &first, &last)
	return first
}

func runJobs(c *cli.Context, d *outdir.Dir, jobs []*compile.Job, rels []string, compiler string) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []string
		slots = make(chan struct{}, max(1, c.Int("jobs")))
	)
	for i, j := range jobs {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			log, err := d.Create(rels[i] + "/compile.log")
			if err == nil {
				err = runJob(c.Context, d, rels[i], j, compiler, log, log)
				if cerr := log.CommitUnsynced(); err == nil {
					err = cerr
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", filepath.Base(j.Dir), err))
				return
			}
			fmt.Fprintf(textOut(c), "compiled %s\n", filepath.Join(j.Dir, compile.BinaryDir))
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		slices.Sort(errs)
		return fmt.Errorf("%d of %d windows failed to compile:\n%s", len(errs), len(jobs), strings.Join(errs, "\n"))
	}
	return nil
}

// runJob runs the compiler of job (in directory rel of d) into a temporary
// directory and, when it succeeds, puts the binary directory in place,
// replacing the earlier one in one step.
func runJob(ctx context.Context, d *outdir.Dir, rel string, job *compile.Job, compiler string, stdout, stderr io.Writer) error {
	tmp, tmpAbs, err := d.TempDir(rel, compile.BinaryDir)
	if err != nil {
		return err
	}
	defer d.RemoveTemp(tmp)
	if err := job.Run(ctx, compiler, filepath.Join(tmpAbs, compile.BinaryDir), stdout, stderr); err != nil {
		return err
	}
	return d.AdoptTree(tmp+"/"+compile.BinaryDir, path.Join(rel, compile.BinaryDir))
}

// compileORT optimises one model into directory rel of d.
func compileORT(c *cli.Context, d *outdir.Dir, model *compile.Model, rel string) (*compile.ORTReport, error) {
	tmp, tmpAbs, err := d.TempDir(rel, "ort") // makes rel too
	if err != nil {
		return nil, err
	}
	defer d.RemoveTemp(tmp)
	r, err := compile.CompileORT(c.Context, model, tmpAbs, compile.ORT{
		Level: c.String("ort-level"), ORTFormat: c.Bool("ort-format"), Python: c.String("python"),
	})
	if err != nil {
		return nil, err
	}
	// Into place; what this run did not make (an earlier run's ORT format) goes.
	for _, name := range []string{compile.ORTModelFile, compile.ORTDataFile, compile.ORTFormatFile} {
		if fileExists(filepath.Join(tmpAbs, name)) {
			err = d.AdoptFile(tmp+"/"+name, path.Join(rel, name))
		} else {
			err = d.Remove(path.Join(rel, name))
		}
		if err != nil {
			return nil, err
		}
	}
	r.Model = d.Join(path.Join(rel, compile.ORTModelFile))
	if r.ORTFormat != "" {
		r.ORTFormat = d.Join(path.Join(rel, compile.ORTFormatFile))
	}
	data, _ := json.MarshalIndent(r, "", "  ")
	if err := d.WriteFile(path.Join(rel, compile.ORTReportFile), append(data, '\n')); err != nil {
		return nil, err
	}
	w := textOut(c)
	fmt.Fprintf(w, "optimised with ONNX Runtime %s (level %s) in %.2fs: %d nodes -> %d\n  %s\n",
		r.ONNXRuntime, r.Level, r.Seconds, r.NodesBefore, r.NodesAfter, r.Model)
	switch {
	case r.ORTFormat != "":
		fmt.Fprintf(w, "  %s (ORT format)\n", r.ORTFormat)
	case r.ORTFormatSkipped != "":
		fmt.Fprintf(w, "  ORT format skipped: %s\n", r.ORTFormatSkipped)
	}
	return r, nil
}
