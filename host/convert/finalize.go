package convert

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/outdir"
	istrata "github.com/strata-llm/strata/internal/atomic"
)

const tempPrefix = istrata.TempPrefix

// writeJSON writes v, indented, atomically as rel in d.
func writeJSON(d *outdir.Dir, rel string, v any) error {
	return writeJSONWith(d.WriteFile, rel, v)
}

// writeJSONWith writes v indented through write (a WriteFile of d's).
func writeJSONWith(write func(rel string, data []byte) error, rel string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return write(rel, append(data, '\n'))
}

// expectedShard is the name, size and header hash a shard of these entries has.
func expectedShard(name string, entries []checkpoint.Entry) (shardResult, error) {
	l, err := checkpoint.Layout(entries)
	if err != nil {
		return shardResult{}, err
	}
	h := sha256.Sum256(l.Header)
	return shardResult{File: name, Size: l.Size, HeaderHash: hex.EncodeToString(h[:]), Bytes: l.Size - 8 - int64(len(l.Header))}, nil
}

// shardOnDisk reads the size and header hash of a shard strata wrote.
func (o *outDir) shardOnDisk(name string) (shardResult, error) {
	f, err := o.d.Open(name)
	if err != nil {
		return shardResult{}, err
	}
	path := f.Name()
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return shardResult{}, err
	}
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		return shardResult{}, err
	}
	hl := int64(binary.LittleEndian.Uint64(n[:]))
	if hl <= 0 || hl > info.Size()-8 || hl > 200<<20 {
		return shardResult{}, fmt.Errorf("%s: bad header length", path)
	}
	header := make([]byte, hl)
	if _, err := io.ReadFull(f, header); err != nil {
		return shardResult{}, err
	}
	h := sha256.Sum256(header)
	return shardResult{File: filepath.Base(path), Size: info.Size(), HeaderHash: hex.EncodeToString(h[:]), Bytes: info.Size() - 8 - hl}, nil
}

// finalize writes the tail, config.json, the other source files, the
// report and, last, the index; it refuses while a layer is missing.
func (o *outDir) finalize(ctx context.Context, res *Result) error {
	var missing []int
	for _, l := range o.p.layers {
		if !o.done(l) {
			missing = append(missing, l)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cannot finalize %s: missing layers %s (%d of %d present); convert them (--layers FIRST-LAST), then run --finalize again", o.dir, compactRange(missing), len(o.p.layers)-len(missing), len(o.p.layers))
	}
	if err := o.checkStaged(); err != nil {
		return err
	}
	o.d.RemoveStaleTemps() // every layer is done: no other run is writing one
	if len(o.p.byLayer[-1]) > 0 && !o.done(-1) {
		var n atomic.Int64
		if err := o.writeLayer(ctx, -1, &n); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := o.writeConfig(); err != nil {
		return err
	}
	if err := o.copySidecars(); err != nil {
		return err
	}
	if err := o.syncShards(); err != nil {
		return err
	}
	report, err := o.report(res)
	if err != nil {
		return err
	}
	if err := writeJSON(o.d, ReportFile, report); err != nil {
		return err
	}
	return o.writeIndex(res)
}

// syncShards flushes every shard to disk, so that the index, written
// next, never describes data still in flight.
func (o *outDir) syncShards() error {
	names := []string{}
	for _, l := range o.p.layers {
		names = append(names, LayerFile(l))
	}
	if len(o.p.byLayer[-1]) > 0 {
		names = append(names, TailFile)
	}
	for _, n := range names {
		f, err := o.d.Open(n)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("syncing %s: %w", n, err)
		}
	}
	return nil
}

// checkStaged re-reads the source's headers: a tensor there that the plan
// did not stage (the source changed, or a file appeared) fails the run,
// naming the keys, before any index is written.
func (o *outDir) checkStaged() error {
	inv, err := openInventory(o.p.inv.dir)
	if err != nil {
		return fmt.Errorf("re-reading the source before finalizing: %w", err)
	}
	var late []string
	for _, k := range inv.keys {
		if _, ok := o.p.accounts[k]; !ok {
			late = append(late, k)
		}
	}
	if len(late) == 0 {
		return nil
	}
	more := ""
	if len(late) > 10 {
		more = fmt.Sprintf(" and %d more", len(late)-10)
		late = late[:10]
	}
	return fmt.Errorf("the source holds tensors that were not staged for any shard: %s%s (the source changed during the conversion?); no index was written: convert into a new --out", strings.Join(late, ", "), more)
}

// writeConfig writes config.json: the source's, with the dtype asked, the
// source's quantisation config removed when its weights were dequantised,
// and ours when quantising.
func (o *outDir) writeConfig() error {
	p := o.p
	var cfg map[string]any
	dec := json.NewDecoder(bytes.NewReader(p.inv.configRaw))
	dec.UseNumber()
	if err := dec.Decode(&cfg); err != nil {
		return err
	}
	if p.dequantizing() {
		// The source's quantisation (also where multimodal releases nest
		// it, as host/quant reads it) describes weights no longer stored.
		delete(cfg, "quantization_config")
		if tc, ok := cfg["text_config"].(map[string]any); ok {
			delete(tc, "quantization_config")
		}
	}
	if p.opts.DType != "" || (p.dequantizing() && p.sourceQuantized()) {
		name := p.opts.DType
		if name == "" {
			name = "bfloat16"
		}
		set := false
		for _, k := range []string{"dtype", "torch_dtype"} {
			if _, ok := cfg[k]; ok {
				cfg[k], set = name, true
			}
		}
		if !set {
			cfg["dtype"] = name
		}
	}
	if qc := p.quantizationConfig(); qc != nil {
		cfg["quantization_config"] = qc
	}
	return writeJSON(o.d, "config.json", cfg)
}

// sourceQuantized: the source holds quantised weights (a quant.View's, or
// gpt-oss MXFP4).
func (p *plan) sourceQuantized() bool {
	for _, g := range p.groups {
		if g.Kind == kindFP8 || g.Kind == kindMXFP4 || g.Kind == kindDequant || g.scale != nil || g.weight != nil {
			return true
		}
	}
	return false
}

// quantizationConfig is config.json's quantization_config for the scheme.
func (p *plan) quantizationConfig() map[string]any {
	switch p.opts.Quantize {
	case QuantFP8Block:
		// transformers' FineGrainedFP8Config, as DeepSeek-V3 and Qwen3-*-FP8 ship it.
		return map[string]any{
			"quant_method":           "fp8",
			"activation_scheme":      "dynamic",
			"fmt":                    "e4m3",
			"weight_block_size":      []int{blockSize, blockSize},
			"modules_to_not_convert": nonNil(p.exclusions),
		}
	case QuantFP8Dynamic:
		// compressed-tensors, as llm-compressor writes its FP8_DYNAMIC scheme.
		args := func(strategy string, dynamic bool, observer any) map[string]any {
			return map[string]any{
				"num_bits": 8, "type": "float", "symmetric": true, "strategy": strategy, "dynamic": dynamic,
				"group_size": nil, "block_structure": nil, "actorder": nil, "observer": observer, "observer_kwargs": map[string]any{},
			}
		}
		return map[string]any{
			"quant_method":        "compressed-tensors",
			"format":              "float-quantized",
			"quantization_status": "compressed",
			"config_groups": map[string]any{"group_0": map[string]any{
				"targets":            []string{"Linear"},
				"weights":            args("channel", false, "minmax"),
				"input_activations":  args("token", true, nil),
				"output_activations": nil,
				"format":             "float-quantized",
			}},
			"ignore":                   nonNil(p.exclusions),
			"kv_cache_scheme":          nil,
			"global_compression_ratio": nil,
		}
	}
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// weightFile: a file of weights the conversion replaces, or one it writes.
func (o *outDir) skipSidecar(name string) bool {
	for _, ext := range []string{".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".onnx"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	switch name {
	case "config.json", IndexFile, "pytorch_model.bin.index.json", ReportFile, ManifestDir:
		return true
	case "hf_quant_config.json", "quant_config.json", "quantization_config.json", "quantize_config.json", "recipe.yaml":
		// Describe the source's quantisation: stale once it changes.
		return o.p.dequantizing()
	}
	return strings.HasPrefix(name, tempPrefix)
}

// copySidecars copies every other regular file of the source (tokenizer,
// generation config, chat template, code), links resolved.
func (o *outDir) copySidecars() error {
	entries, err := os.ReadDir(o.p.inv.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if o.skipSidecar(name) {
			continue
		}
		path, err := regularFile(filepath.Join(o.p.inv.dir, name))
		if err != nil {
			continue // directories and special files are not copied
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("copying %s: %w", name, err)
		}
		if err := o.d.WriteFile(name, data); err != nil {
			return err
		}
	}
	return nil
}

// report is convert-report.json.
type report struct {
	Format       string         `json:"format"`
	Source       string         `json:"source"`
	DType        string         `json:"dtype,omitempty"`
	Quantize     string         `json:"quantize,omitempty"`
	Layers       []int          `json:"layers"`
	Summary      map[string]int `json:"summary"`
	MTP          *MTP           `json:"mtp"`
	Exclusions   []string       `json:"exclusions,omitempty"`
	Quantization map[string]any `json:"quantization_config,omitempty"`
	// SourceQuantization is the source's quantisation, when its weights
	// were dequantised through host/quant.
	SourceQuantization *sourceQuantization `json:"source_quantization,omitempty"`
	Tensors            []*accounting       `json:"tensors"`
}

// sourceQuantization describes a quantised source that was dequantised.
type sourceQuantization struct {
	Method  string   `json:"quant_method"`
	Format  string   `json:"format"`
	Weights int      `json:"weights"` // quantised weights, each one output tensor
	Notes   []string `json:"notes,omitempty"`
}

// sourceQuantization is the report's account of the source's quantisation.
func (p *plan) sourceQuantization() *sourceQuantization {
	if !p.viewDriven() {
		return nil
	}
	return &sourceQuantization{Method: p.view.Method, Format: p.view.Format, Weights: p.view.Len(), Notes: p.view.Notes}
}

// report gathers the accounting from the shard records (a resumed or
// scaled-out run did not plan every layer in this process) and checks that
// every source tensor is written or deliberately dropped.
func (o *outDir) report(res *Result) (*report, error) {
	r := &report{Format: "strata-convert-report/1", Source: filepath.Base(o.p.inv.dir), DType: o.p.opts.DType,
		Quantize: o.p.opts.Quantize, Layers: o.p.layers, Summary: map[string]int{}, MTP: o.p.mtp,
		Exclusions: o.p.exclusions, Quantization: o.p.quantizationConfig(), SourceQuantization: o.p.sourceQuantization()}
	seen := map[string]bool{}
	layers := slices.Clone(o.p.layers)
	if len(o.p.byLayer[-1]) > 0 {
		layers = append(layers, -1)
	}
	for _, l := range layers {
		data, err := o.d.ReadFile(ManifestDir + "/" + recordName(l))
		if err != nil {
			return nil, err
		}
		var rec layerRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return nil, fmt.Errorf("%s: %w", recordName(l), err)
		}
		for _, a := range rec.Tensors {
			seen[a.Key] = true
			r.Tensors = append(r.Tensors, a)
		}
	}
	// Tensors of the tail's accounting when the tail has no shard (all dropped).
	for _, a := range o.p.accountsOf(-1) {
		if !seen[a.Key] {
			seen[a.Key] = true
			r.Tensors = append(r.Tensors, a)
		}
	}
	var lost []string
	for _, k := range o.p.inv.keys {
		if !seen[k] {
			lost = append(lost, k)
		}
	}
	if len(lost) > 0 {
		return nil, fmt.Errorf("source tensors neither written nor dropped: %s; no index was written", strings.Join(lost, ", "))
	}
	sort.Slice(r.Tensors, func(i, j int) bool { return r.Tensors[i].Key < r.Tensors[j].Key })
	for _, a := range r.Tensors {
		r.Summary[a.Action]++
		r.Summary["source_tensors"]++
		if a.Action == "dropped" {
			res.Dropped++
		} else {
			r.Summary["written"]++
		}
		if a.MTP {
			r.Summary["mtp"]++
		}
	}
	res.Sources = len(r.Tensors)
	return r, nil
}

// writeIndex writes model.safetensors.index.json from the shards on disk.
func (o *outDir) writeIndex(res *Result) error {
	weightMap := map[string]string{}
	var total int64
	files := []string{}
	for _, l := range o.p.layers {
		files = append(files, LayerFile(l))
	}
	if len(o.p.byLayer[-1]) > 0 {
		files = append(files, TailFile)
	}
	for _, name := range files {
		if !o.d.Owned(name) {
			return fmt.Errorf("re-reading %s: not the file strata wrote (it changed since); run the same command again", o.d.Join(name))
		}
		ck, err := checkpoint.OpenFile(filepath.Join(o.dir, name))
		if err != nil {
			return fmt.Errorf("re-reading %s: %w", name, err)
		}
		for _, k := range ck.Keys() {
			t, _ := ck.Tensor(k)
			if prev, dup := weightMap[k]; dup {
				return fmt.Errorf("tensor %s is in both %s and %s", k, prev, name)
			}
			weightMap[k] = name
			total += t.Length
		}
	}
	want := 0
	for _, g := range o.p.groups {
		want += len(g.Outputs)
	}
	if len(weightMap) != want {
		return fmt.Errorf("the shards hold %d tensors, the plan %d: no index was written", len(weightMap), want)
	}
	res.Outputs = len(weightMap)
	idx := map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}
	return writeJSON(o.d, IndexFile, idx)
}
