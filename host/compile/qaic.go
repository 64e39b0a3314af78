package compile

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// DefaultCompiler is where the Cloud AI SDK installs qaic-compile.
const DefaultCompiler = "/opt/qti-aic/exec/qaic-compile"

// QAIC holds qaic-compile options, mapped as QEfficient's
// QEFFAutoModelForCausalLM.compile maps its keyword arguments.
type QAIC struct {
	BatchSize        int
	PrefillSeqLen    int
	CtxLen           int
	FullBatchSize    int // continuous batching: decode batch size
	KVCacheBatchSize int // continuous batching: KV-cache rows (default FullBatchSize)
	CCLPrefill       []int
	CCLDecode        []int
	NumCores         int
	NumDevices       int
	MXFP6Matmul      bool
	MXINT8KVCache    bool // a custom-IO precision, not a compiler flag
	MOS              int  // -mos=N when > 0
	DepthFirst       bool // -aic-enable-depth-first
	SplitRetained    bool // -split-retained-state-io
	HWVersion        string
	Subfunctions     bool     // -sub-functions
	Extra            []string // any other compiler flags, passed as given
}

// Job is one qaic-compile run: the files to write beside it and the command.
type Job struct {
	// Dir is the compile directory; every path in Args is relative to it.
	Dir             string
	Specializations []Specialization
	CustomIO        []CustomIO
	MDP             *MDPConfig // multi-device tensor slicing, or nil
	Args            []string   // after the compiler binary
	// Model is the model's path relative to Dir (Args hold it as -m=).
	Model string
	// Notes explain adjustments made to the options (CCL lists).
	Notes []string
}

// Specialization is one compiled shape: a name and its symbol values.
type Specialization struct {
	Name    string            `json:"name"`
	Symbols map[string]string `json:"symbols"`
}

// CustomIO gives one graph input or output a precision.
type CustomIO struct {
	Name, Precision string
}

// MDPConfig is the template tensor-slicing partition config.
type MDPConfig struct {
	Connections []MDPConnection `json:"connections"`
	Partitions  []MDPPartition  `json:"partitions"`
}

// MDPConnection links devices.
type MDPConnection struct {
	Devices []int  `json:"devices"`
	Type    string `json:"type"`
}

// MDPPartition places devices and cores. (Fields in key order: the file
// is written with sorted keys.)
type MDPPartition struct {
	Devices []MDPDevice `json:"devices"`
	Name    string      `json:"name"`
}

// MDPDevice is one device of a partition.
type MDPDevice struct {
	DeviceID int `json:"deviceId"`
	NumCores int `json:"numCores"`
}

// Files written in a compile directory.
const (
	SpecializationsFile = "specializations.json"
	CustomIOFile        = "custom_io.yaml"
	ScriptFile          = "compile.sh"
	BinaryDir           = "qpc"
	partialBinaryDir    = "qpc.partial"
)

func mdpFile(devices int) string { return fmt.Sprintf("mdp_ts_%d.json", devices) }

// PlanQAIC prepares the compilation of model into dir.
func PlanQAIC(m *Model, dir string, o QAIC) (*Job, error) {
	if err := o.check(m); err != nil {
		return nil, err
	}
	j := &Job{Dir: dir}
	var err error
	if j.Specializations, err = o.specializations(m, j); err != nil {
		return nil, err
	}
	j.CustomIO = o.customIO(m)
	if o.NumDevices > 1 {
		j.MDP = mdpConfig(o.NumDevices, o.NumCores)
	}
	model, err := relativeTo(dir, m.Path)
	if err != nil {
		return nil, err
	}
	j.Model = filepath.ToSlash(model)
	j.Args = o.args(j.Model, j)
	return j, nil
}

// relativeTo is target's path from dir, whichever of them is relative to
// the working directory and whichever absolute (filepath.Rel refuses a
// mix), through the directories the kernel resolves: the compiler runs in
// dir, where a ".." leaves a symlinked directory for its target's parent.
func relativeTo(dir, target string) (string, error) {
	real := func(p string) (string, error) {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if r, err := filepath.EvalSymlinks(abs); err == nil {
			return r, nil
		}
		// Not there yet (a directory compile will make): its parent may be.
		if r, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
			return filepath.Join(r, filepath.Base(abs)), nil
		}
		return abs, nil
	}
	d, err := real(dir)
	if err != nil {
		return "", err
	}
	t, err := real(target)
	if err != nil {
		return "", err
	}
	return filepath.Rel(d, t)
}

func (o QAIC) check(m *Model) error {
	if err := o.CheckFlags(); err != nil {
		return err
	}
	var errs []error
	need := func(ok bool, msg string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(msg, args...))
		}
	}
	need(!m.ContinuousBatching || o.FullBatchSize > 0, "the export uses continuous batching: pass --full-batch-size")
	need(m.ContinuousBatching || o.FullBatchSize == 0 && o.KVCacheBatchSize == 0,
		"--full-batch-size and --kv-cache-batch-size need an export made with --continuous-batching")
	need(m.CCL || len(o.CCLPrefill)+len(o.CCLDecode) == 0, "--comp-ctx-lengths-prefill/-decode need an export made with --ccl")
	need(!m.CCL || len(o.CCLPrefill)+len(o.CCLDecode) > 0,
		"the export uses compute-context-length: pass --comp-ctx-lengths-prefill and/or --comp-ctx-lengths-decode (strata does not invent CCL lists)")
	need(!o.Subfunctions || m.LayerFunctions, "--subfunctions: the export's decoder layers are inlined; export it with --subfunctions")
	return errors.Join(errs...)
}

// CheckFlags checks what needs no model, so that a compile can refuse bad
// flags before it exports anything.
func (o QAIC) CheckFlags() error {
	var errs []error
	need := func(ok bool, msg string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(msg, args...))
		}
	}
	need(o.BatchSize > 0, "--batch-size must be at least 1, got %d", o.BatchSize)
	need(o.PrefillSeqLen > 0, "--prefill-seq-len must be at least 1, got %d", o.PrefillSeqLen)
	need(o.CtxLen > 0, "--ctx-len must be given and at least 1, got %d", o.CtxLen)
	need(o.PrefillSeqLen <= o.CtxLen, "--prefill-seq-len %d exceeds --ctx-len %d", o.PrefillSeqLen, o.CtxLen)
	need(o.NumCores > 0 && o.NumDevices > 0, "--num-cores and --num-devices must be at least 1")
	need(o.FullBatchSize >= 0 && o.KVCacheBatchSize >= 0 && o.MOS >= 0, "--full-batch-size, --kv-cache-batch-size and --mos cannot be negative")
	for _, v := range append(append([]int{}, o.CCLPrefill...), o.CCLDecode...) {
		need(v > 0, "compute-context lengths must be positive, got %d", v)
	}
	return errors.Join(errs...)
}

// kvRows is the KV cache's batch: kv-cache-batch-size, else full batch, else batch.
func (o QAIC) kvRows() int {
	switch {
	case o.KVCacheBatchSize > 0:
		return o.KVCacheBatchSize
	case o.FullBatchSize > 0:
		return o.FullBatchSize
	}
	return o.BatchSize
}

// specializations builds, as QEfficient does, one Prefill (one per prefill
// CCL value) and one Decode (one per decode CCL value; none when prefill is
// one token without continuous batching); duplicate names get _0, _1, ...
func (o QAIC) specializations(m *Model, j *Job) ([]Specialization, error) {
	var prefillCCL, decodeCCL []int
	if m.CCL {
		prefillCCL, decodeCCL, j.Notes = cclLists(o.CCLPrefill, o.CCLDecode, o.CtxLen, o.PrefillSeqLen)
	}
	cb := m.ContinuousBatching
	var specs []Specialization
	lengths := prefillCCL
	if o.PrefillSeqLen == 1 {
		lengths = decodeCCL
	}
	for _, ccl := range orNone(lengths) {
		specs = append(specs, o.prefill(cb, ccl))
	}
	if o.PrefillSeqLen != 1 {
		for _, ccl := range orNone(decodeCCL) {
			specs = append(specs, o.decode(cb, ccl))
		}
	}
	return uniqueNames(specs), nil
}

// orNone is the CCL values to loop over, or one 0 (no CCL symbol).
func orNone(v []int) []int {
	if len(v) == 0 {
		return []int{0}
	}
	return v
}

func (o QAIC) prefill(cb bool, ccl int) Specialization {
	batch := o.BatchSize
	if cb {
		batch = 1
		if o.PrefillSeqLen == 1 {
			batch = o.FullBatchSize
		}
	}
	s := symbols(batch, o.PrefillSeqLen, o.CtxLen, ccl)
	if cb {
		s["full_batch_size"] = strconv.Itoa(o.kvRows())
		s["full_batch_exec_size"] = strconv.Itoa(batch)
	} else {
		s["batch_size"] = strconv.Itoa(o.kvRows())
	}
	return Specialization{Name: "Prefill", Symbols: s}
}

func (o QAIC) decode(cb bool, ccl int) Specialization {
	batch := o.BatchSize
	if cb {
		batch = o.FullBatchSize
	}
	s := symbols(batch, 1, o.CtxLen, ccl)
	if cb {
		s["full_batch_size"] = strconv.Itoa(o.kvRows())
	} else {
		s["batch_size"] = strconv.Itoa(o.kvRows())
	}
	return Specialization{Name: "Decode", Symbols: s}
}

func symbols(batch, seq, ctx, ccl int) map[string]string {
	s := map[string]string{"batch_size": strconv.Itoa(batch), "seq_len": strconv.Itoa(seq), "ctx_len": strconv.Itoa(ctx)}
	if ccl > 0 {
		s["comp_ctx_lengths"] = strconv.Itoa(ccl)
	}
	return s
}

// uniqueNames suffixes repeated names _0, _1, ... as the compiler needs.
func uniqueNames(specs []Specialization) []Specialization {
	count := map[string]int{}
	for _, s := range specs {
		count[s.Name]++
	}
	seen := map[string]int{}
	for i, s := range specs {
		if count[s.Name] > 1 {
			specs[i].Name = fmt.Sprintf("%s_%d", s.Name, seen[s.Name])
			seen[s.Name]++
		}
	}
	return specs
}

// CCL constants of the reference toolchain.
const (
	cclMinCtxLen  = 1024 // smaller lengths are raised to it
	cclUniqueStep = 32   // a prefill length equal to a decode one moves down to a multiple of this
)

// cclLists validates compute-context lengths as QEfficient does: each at
// least 1024 (or ctx_len if smaller) and at most ctx_len, sorted, unique,
// each list ending with ctx_len; with one-token prefill both lists are their
// union; otherwise a prefill length that a decode length repeats moves down
// to the next multiple of 32 (the compiler needs distinct values). Notes
// report what changed.
func cclLists(prefill, decode []int, ctxLen, prefillSeqLen int) (p, d []int, notes []string) {
	if len(prefill) == 0 {
		prefill = []int{ctxLen}
	}
	if len(decode) == 0 {
		decode = []int{ctxLen}
	}
	p, d = clampCCL(prefill, ctxLen), clampCCL(decode, ctxLen)
	if prefillSeqLen == 1 {
		u := sortedUnique(append(append([]int{}, p...), d...))
		return u, u, describeCCL(prefill, decode, u, u)
	}
	var moved []int
	for _, v := range p {
		for slices.Contains(d, v) || slices.Contains(moved, v) {
			v = (v - 1) / cclUniqueStep * cclUniqueStep
		}
		if v > 0 {
			moved = append(moved, v)
		}
	}
	p = sortedUnique(moved)
	return p, d, describeCCL(prefill, decode, p, d)
}

func clampCCL(v []int, ctxLen int) []int {
	out := make([]int, 0, len(v)+1)
	for _, x := range v {
		out = append(out, min(max(x, cclMinCtxLen), ctxLen))
	}
	out = sortedUnique(out)
	if out[len(out)-1] < ctxLen {
		out = append(out, ctxLen)
	}
	return out
}

func sortedUnique(v []int) []int {
	sort.Ints(v)
	return slices.Compact(v)
}

func describeCCL(prefill, decode, p, d []int) []string {
	var notes []string
	if !slices.Equal(prefill, p) {
		notes = append(notes, fmt.Sprintf("prefill compute-context lengths %v compiled as %v", prefill, p))
	}
	if !slices.Equal(decode, d) {
		notes = append(notes, fmt.Sprintf("decode compute-context lengths %v compiled as %v", decode, d))
	}
	return notes
}

// customIO gives every cache input and its retained output the KV precision:
// mxint8, or float16 for a float32 or float16 graph (the compiler does not
// take float32 I/O).
func (o QAIC) customIO(m *Model) []CustomIO {
	precision := "float16"
	if o.MXINT8KVCache {
		precision = "mxint8"
	} else if m.CacheType == onnxpb.TensorProto_BFLOAT16 {
		precision = "bfloat16"
	}
	var out []CustomIO
	for _, c := range m.Caches {
		out = append(out, CustomIO{c, precision}, CustomIO{c + "_RetainedState", precision})
	}
	return out
}

func mdpConfig(devices, cores int) *MDPConfig {
	c := &MDPConfig{Partitions: []MDPPartition{{Name: "Partition0"}}}
	ids := make([]int, devices)
	for i := range ids {
		ids[i] = i
		c.Partitions[0].Devices = append(c.Partitions[0].Devices, MDPDevice{DeviceID: i, NumCores: cores})
	}
	c.Connections = []MDPConnection{{Devices: ids, Type: "p2p"}}
	return c
}

// args is the qaic-compile command line, in the order QEfficient builds it.
func (o QAIC) args(model string, j *Job) []string {
	a := []string{"-aic-hw", "-aic-hw-version=" + o.HWVersion, "-m=" + model, "-retained-state", "-convert-to-fp16"}
	if o.MXFP6Matmul {
		a = append(a, "-mxfp6-matmul")
	}
	a = append(a, fmt.Sprintf("-aic-num-cores=%d", o.NumCores))
	if o.MOS > 0 {
		a = append(a, fmt.Sprintf("-mos=%d", o.MOS))
	}
	if o.DepthFirst {
		a = append(a, "-aic-enable-depth-first")
	}
	if o.SplitRetained {
		a = append(a, "-split-retained-state-io")
	}
	a = append(a, o.Extra...)
	if o.Subfunctions {
		a = append(a, "-sub-functions")
	}
	if j.MDP != nil {
		a = append(a, "-mdp-load-partition-config="+mdpFile(o.NumDevices))
	}
	a = append(a, "-network-specialization-config="+SpecializationsFile)
	if len(j.CustomIO) > 0 {
		a = append(a, "-custom-IO-list-file="+CustomIOFile)
	}
	return append(a, "-aic-binary-dir="+partialBinaryDir)
}

// pythonJSON renders v as QEfficient's create_json does (json.dump with
// indent 4, separators (",", ":"), sorted keys): Go's indented JSON with the
// space after each key's colon removed. None of the keys or values here
// contains the sequence `": `.
func pythonJSON(v any) ([]byte, error) {
	data, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return nil, err
	}
	return []byte(strings.ReplaceAll(string(data), `": `, `":`)), nil
}
