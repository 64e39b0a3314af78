// Command benchconvert measures strata convert on a multi-GB checkpoint
// (make bench-convert): a Llama-shaped bf16 checkpoint with real data (not
// sparse holes) is converted as stored, to fp8-block and to fp8-dynamic,
// timed side by side with cp of the same directory; peak RSS (strata's own
// --stats, procfs VmHWM) at two layer counts shows memory is flat in the
// model's size. It prints a Markdown table and writes JSON.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/strata-llm/strata/host/checkpoint"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchconvert:", err)
		os.Exit(1)
	}
}

type options struct {
	strata, work, jsonPath string
	layers                 []int
	runs                   int
	hidden, inter, vocab   int64
}

func run(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("benchconvert", flag.ContinueOnError)
	var o options
	var layers string
	fl.StringVar(&o.strata, "strata", "bin/strata", "the strata binary")
	fl.StringVar(&o.work, "work", "", "scratch directory (default: a temporary one, removed); needs about 2 × the checkpoint")
	fl.StringVar(&o.jsonPath, "json", "bench/convert-results.json", "where to write the results")
	fl.StringVar(&layers, "layers", "4,16", "layer counts; the timing table uses the largest")
	fl.IntVar(&o.runs, "runs", 3, "runs per measurement at the largest layer count (median wall time)")
	fl.Int64Var(&o.hidden, "hidden", 4096, "hidden size")
	fl.Int64Var(&o.inter, "intermediate", 14336, "MLP intermediate size")
	fl.Int64Var(&o.vocab, "vocab", 128256, "vocabulary size")
	if err := fl.Parse(args); err != nil {
		return err
	}
	for _, s := range strings.Split(layers, ",") {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil || n < 1 {
			return fmt.Errorf("--layers %q: comma-separated positive counts", layers)
		}
		o.layers = append(o.layers, n)
	}
	slices.Sort(o.layers)
	if _, err := os.Stat(o.strata); err != nil {
		return fmt.Errorf("%s: %w (build it first: make build)", o.strata, err)
	}
	if o.work == "" {
		dir, err := os.MkdirTemp("", "strata-bench-convert-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.work = dir
	}
	res := results{Machine: machine(), Hidden: o.hidden, Intermediate: o.inter, Vocab: o.vocab, Runs: o.runs, LoadBefore: loadavg()}
	for _, n := range o.layers {
		src := filepath.Join(o.work, fmt.Sprintf("src-%d", n))
		size, err := o.writeCheckpoint(src, n)
		if err != nil {
			return err
		}
		runs := 1
		if n == o.layers[len(o.layers)-1] {
			runs = o.runs
		}
		for _, m := range modes {
			r, err := o.measure(src, n, size, m, runs)
			if err != nil {
				return err
			}
			res.Rows = append(res.Rows, r)
			fmt.Fprintf(os.Stderr, "%d layers, %s: %.2f s\n", n, m.name, r.WallSeconds)
		}
		os.RemoveAll(src)
	}
	res.LoadAfter = loadavg()
	res.print(stdout)
	data, _ := json.MarshalIndent(res, "", "  ")
	return os.WriteFile(o.jsonPath, append(data, '\n'), 0o644)
}

type mode struct {
	name string
	args []string // nil: cp
	sync bool     // cp followed by sync (strata syncs before writing its index)
}

var modes = []mode{
	{name: "cp -r", sync: false},
	{name: "cp -r && sync", sync: true},
	{name: "strata convert (as stored, bf16)", args: []string{}},
	{name: "strata convert --quantize fp8-block", args: []string{"--quantize", "fp8-block"}},
	{name: "strata convert --quantize fp8-dynamic", args: []string{"--quantize", "fp8-dynamic"}},
}

type row struct {
	Mode        string  `json:"mode"`
	Layers      int     `json:"layers"`
	SourceBytes int64   `json:"source_bytes"`
	WallSeconds float64 `json:"wall_seconds"` // median
	CPUSeconds  float64 `json:"cpu_seconds,omitempty"`
	PeakRSS     int64   `json:"peak_rss_bytes,omitempty"`
	OutBytes    int64   `json:"output_bytes"`
}

type results struct {
	Machine      string `json:"machine"`
	Hidden       int64  `json:"hidden"`
	Intermediate int64  `json:"intermediate"`
	Vocab        int64  `json:"vocab"`
	Runs         int    `json:"runs"`
	LoadBefore   string `json:"load_average_before"` // other work on the machine skews wall times; CPU times less
	LoadAfter    string `json:"load_average_after"`
	Rows         []row  `json:"rows"`
}

func (o *options) measure(src string, layers int, size int64, m mode, runs int) (row, error) {
	r := row{Mode: m.name, Layers: layers, SourceBytes: size}
	var walls []float64
	for i := range runs {
		out := filepath.Join(o.work, "out")
		os.RemoveAll(out)
		stats := filepath.Join(o.work, "stats.json")
		var cmd *exec.Cmd
		if m.args == nil {
			script := "cp -r \"$1\" \"$2\""
			if m.sync {
				script += " && sync"
			}
			cmd = exec.Command("sh", "-c", script, "sh", src, out)
		} else {
			cmd = exec.Command(o.strata, append([]string{"--stats", stats, "convert", src, "--out", out, "-j", fmt.Sprint(runtime.NumCPU())}, m.args...)...)
		}
		cmd.Stderr = io.Discard
		start := time.Now()
		if msg, err := cmd.Output(); err != nil {
			return r, fmt.Errorf("%s: %v\n%s", m.name, err, msg)
		}
		walls = append(walls, time.Since(start).Seconds())
		if m.args != nil {
			data, _ := os.ReadFile(stats)
			var raw struct {
				Host struct {
					User float64 `json:"user_seconds"`
					Sys  float64 `json:"system_seconds"`
					Peak int64   `json:"peak_rss_bytes"`
				} `json:"host"`
			}
			json.Unmarshal(data, &raw)
			r.PeakRSS = max(r.PeakRSS, raw.Host.Peak)
			if i == runs/2 {
				r.CPUSeconds = raw.Host.User + raw.Host.Sys
			}
		}
		if i == runs-1 {
			r.OutBytes = dirBytes(out)
		}
		os.RemoveAll(out)
	}
	slices.Sort(walls)
	r.WallSeconds = walls[len(walls)/2]
	return r, nil
}

func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
		return nil
	})
	return n
}

// writeCheckpoint writes a Llama-shaped bf16 checkpoint, one shard per
// four layers as releases shard, with random normal-ish data.
func (o *options) writeCheckpoint(dir string, layers int) (int64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	h, in, v := o.hidden, o.inter, o.vocab
	kv := h / 4
	pattern := randomBF16(32 << 20)
	type tensor struct {
		name  string
		shape []int64
	}
	var shards [][]tensor
	shards = append(shards, []tensor{{"model.embed_tokens.weight", []int64{v, h}}})
	for i := range layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		ts := []tensor{
			{p + "input_layernorm.weight", []int64{h}}, {p + "post_attention_layernorm.weight", []int64{h}},
			{p + "self_attn.q_proj.weight", []int64{h, h}}, {p + "self_attn.k_proj.weight", []int64{kv, h}},
			{p + "self_attn.v_proj.weight", []int64{kv, h}}, {p + "self_attn.o_proj.weight", []int64{h, h}},
			{p + "mlp.gate_proj.weight", []int64{in, h}}, {p + "mlp.up_proj.weight", []int64{in, h}},
			{p + "mlp.down_proj.weight", []int64{h, in}},
		}
		if i%4 == 0 {
			shards = append(shards, nil)
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], ts...)
	}
	shards = append(shards, []tensor{{"model.norm.weight", []int64{h}}, {"lm_head.weight", []int64{v, h}}})
	weightMap := map[string]string{}
	var total int64
	at := 0
	for si, ts := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", si+1, len(shards))
		var entries []checkpoint.Entry
		for _, t := range ts {
			entries = append(entries, checkpoint.Entry{Name: t.name, DType: "BF16", Shape: t.shape})
			weightMap[t.name] = name
		}
		w, err := checkpoint.CreateSafetensors(filepath.Join(dir, name), entries)
		if err != nil {
			return 0, err
		}
		for _, t := range ts {
			n := int64(2)
			for _, d := range t.shape {
				n *= d
			}
			buf := make([]byte, 0, n)
			for int64(len(buf)) < n {
				k := min(n-int64(len(buf)), int64(len(pattern)-at))
				buf = append(buf, pattern[at:at+int(k)]...)
				at = (at + int(k) + 4098) % (len(pattern) - 8192) // shift so tensors differ
				at &^= 1
			}
			if err := w.Write(buf); err != nil {
				w.Abort()
				return 0, err
			}
			total += n
		}
		if err := w.Close(); err != nil {
			return 0, err
		}
	}
	idx, _ := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}, "", "  ")
	cfg, _ := json.MarshalIndent(map[string]any{"model_type": "llama", "architectures": []string{"LlamaForCausalLM"},
		"hidden_size": h, "intermediate_size": in, "num_hidden_layers": layers, "vocab_size": v, "dtype": "bfloat16"}, "", "  ")
	for name, data := range map[string][]byte{"model.safetensors.index.json": idx, "config.json": cfg, "tokenizer.json": []byte("{}")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return 0, err
		}
	}
	return dirBytes(dir), nil
}

func randomBF16(n int) []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]byte, n)
	for i := 0; i < n; i += 2 {
		x := float32(rng.NormFloat64() * 0.02)
		binary.LittleEndian.PutUint16(out[i:], uint16(math.Float32bits(x)>>16))
	}
	return out
}

func machine() string {
	model := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	return fmt.Sprintf("%s, %d cores, %s/%s, %s", model, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
}

func (r results) print(w io.Writer) {
	fmt.Fprintf(w, "%s; Llama-shaped bf16 (hidden %d, intermediate %d, vocab %d), median of %d runs at the largest size; load average %s before, %s after\n\n", r.Machine, r.Hidden, r.Intermediate, r.Vocab, r.Runs, r.LoadBefore, r.LoadAfter)
	fmt.Fprintln(w, "| layers | source | what | wall | vs cp | CPU | peak RSS | written |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	cp := map[int]float64{}
	for _, x := range r.Rows {
		if x.Mode == "cp -r" {
			cp[x.Layers] = x.WallSeconds
		}
	}
	for _, x := range r.Rows {
		rss, cpu := "–", "–"
		if x.PeakRSS > 0 {
			rss = fmt.Sprintf("%.0f MiB", float64(x.PeakRSS)/(1<<20))
			cpu = fmt.Sprintf("%.1f s", x.CPUSeconds)
		}
		fmt.Fprintf(w, "| %d | %.2f GB | %s | %.2f s | %.2f× | %s | %s | %.2f GB |\n", x.Layers, float64(x.SourceBytes)/1e9, x.Mode,
			x.WallSeconds, x.WallSeconds/cp[x.Layers], cpu, rss, float64(x.OutBytes)/1e9)
	}
}

// loadavg is the 1-minute load average, as /proc/loadavg says.
func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(data))[0]
}
