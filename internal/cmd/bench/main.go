// Command bench measures strata export at real scale (make bench): for each
// shipped release config (bench/configs), a header-only checkpoint sharded
// as released, exported whole, layerwise by single layers, and with layer
// functions; then one architecture at 8, 32 and 128 layers to show the cost
// per layer is flat. Each figure comes from strata's own --stats (getrusage
// of the host and of the plugins it waited for) and the wall clock around
// the process. It prints Markdown tables and writes them as JSON.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/strata-llm/strata/internal/headeronly"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	strata, configs, jsonPath, work string
	runs                            int
	scaling                         string
	only                            string
}

func run(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o options
	fl.StringVar(&o.strata, "strata", "bin/strata", "the strata binary (its plugins next to it)")
	fl.StringVar(&o.configs, "configs", "bench/configs", "directory of release configs (config.json + release.json each)")
	fl.StringVar(&o.jsonPath, "json", "bench/results.json", "where to write the results as JSON")
	fl.StringVar(&o.work, "work", "", "scratch directory for checkpoints and exports (default: a temporary one, removed)")
	fl.IntVar(&o.runs, "runs", 3, "runs per measurement; the median wall and CPU time and the largest peak RSS are reported")
	fl.StringVar(&o.scaling, "scaling", "llama-3.1-8b", "release whose layer count is varied (8, 32, 128); empty: skip")
	fl.StringVar(&o.only, "only", "", "comma-separated release names to measure (default: all)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if o.runs < 1 {
		return fmt.Errorf("--runs must be at least 1, got %d", o.runs)
	}
	if _, err := os.Stat(o.strata); err != nil {
		return fmt.Errorf("%s: %w (build it first: make build)", o.strata, err)
	}
	if o.work == "" {
		dir, err := os.MkdirTemp("", "strata-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.work = dir
	}
	res := results{Machine: describeMachine(), Strata: strataVersion(o.strata), Runs: o.runs}
	releases, err := loadReleases(o.configs, o.only)
	if err != nil {
		return err
	}
	for _, r := range releases {
		rows, err := o.measureRelease(r)
		if err != nil {
			return err
		}
		res.Releases = append(res.Releases, rows...)
	}
	if o.scaling != "" {
		if res.Scaling, err = o.measureScaling(); err != nil {
			return err
		}
	}
	res.print(stdout)
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(o.jsonPath, append(data, '\n'), 0o644)
}

// mode is one way of exporting.
type mode struct {
	Name string
	Args []string
}

var modes = []mode{
	{"whole", nil},
	{"layerwise w1", []string{"--layerwise", "--window-size", "1"}},
	{"subfunctions", []string{"--subfunctions"}},
}

// row is one measured export.
type row struct {
	Release          string  `json:"release"`
	Mode             string  `json:"mode"`
	Layers           int     `json:"layers"`
	Shards           int     `json:"shards"`
	WallSeconds      float64 `json:"wall_seconds"`
	CPUSeconds       float64 `json:"cpu_seconds"` // host + plugins, user + system
	HostPeakRSS      int64   `json:"host_peak_rss_bytes"`
	PluginPeakRSS    int64   `json:"plugin_peak_rss_bytes"`
	BytesRead        int64   `json:"checkpoint_bytes_read"`
	HeaderBytes      int64   `json:"checkpoint_header_bytes"` // config + index + safetensors headers
	ModelBytes       int64   `json:"model_onnx_bytes"`
	OtherModelBytes  int64   `json:"other_models_bytes,omitempty"` // mtp.onnx, vision.onnx
	MarginalMsPerLyr float64 `json:"marginal_ms_per_layer,omitempty"`
	// StealPercent is the share of CPU time the hypervisor took from this
	// VM while the row ran (/proc/stat): walls of a row with much steal
	// are the host's, not strata's.
	StealPercent float64 `json:"cpu_steal_percent"`
}

type results struct {
	Machine  machine `json:"machine"`
	Strata   string  `json:"strata"`
	Runs     int     `json:"runs"`
	Releases []row   `json:"releases"`
	Scaling  []row   `json:"scaling"`
}

func loadReleases(dir, only string) ([]headeronly.Release, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var want []string
	if only != "" {
		want = strings.Split(only, ",")
	}
	var out []headeronly.Release
	for _, e := range entries {
		if !e.IsDir() || (want != nil && !slices.Contains(want, e.Name())) {
			continue
		}
		r, err := headeronly.LoadRelease(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no releases in %s match %q", dir, only)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (o options) measureRelease(r headeronly.Release) ([]row, error) {
	ckpt := filepath.Join(o.work, r.Name)
	st, err := headeronly.WriteRelease(ckpt, r)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(ckpt)
	var rows []row
	var all []mode
	for _, m := range modes {
		if r.CommonModes == nil || slices.Contains(r.CommonModes, m.Name) {
			all = append(all, m)
		}
	}
	for _, m := range r.Modes {
		all = append(all, mode{m.Name, m.Args})
	}
	for _, m := range all {
		x, err := o.measure(ckpt, m)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", r.Name, m.Name, err)
		}
		x.Release, x.Shards = r.Name, st.Shards
		x.HeaderBytes, err = headerBytes(ckpt, st)
		if err != nil {
			return nil, err
		}
		rows = append(rows, x)
	}
	return rows, nil
}

// headerBytes is what a header-only read must read: config.json, the index
// and every shard's length prefix and JSON header.
func headerBytes(dir string, st headeronly.Stats) (int64, error) {
	n := st.HeaderBytes
	for _, name := range []string{"config.json", "model.safetensors.index.json"} {
		info, err := os.Stat(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		n += info.Size()
	}
	return n, nil
}

// measureScaling exports the scaling release with 8, 32 and 128 layers.
func (o options) measureScaling() ([]row, error) {
	r, err := headeronly.LoadRelease(filepath.Join(o.configs, o.scaling))
	if err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := json.Unmarshal(r.Config, &cfg); err != nil {
		return nil, err
	}
	var rows []row
	for _, m := range modes[:2] {
		var prev *row
		for _, layers := range []int{8, 32, 128} {
			cfg["num_hidden_layers"] = layers
			data, _ := json.Marshal(cfg)
			tensors, err := headeronly.Tensors(data, "BF16")
			if err != nil {
				return nil, err
			}
			ckpt := filepath.Join(o.work, fmt.Sprintf("%s-%d", r.Name, layers))
			st, err := headeronly.Write(ckpt, data, tensors, r.MaxShardBytes)
			if err != nil {
				return nil, err
			}
			x, err := o.measure(ckpt, m)
			os.RemoveAll(ckpt)
			if err != nil {
				return nil, fmt.Errorf("%s %d layers %s: %w", r.Name, layers, m.Name, err)
			}
			x.Release, x.Shards = fmt.Sprintf("%s, %d layers", r.Name, layers), st.Shards
			if prev != nil {
				x.MarginalMsPerLyr = 1000 * (x.WallSeconds - prev.WallSeconds) / float64(layers-prev.Layers)
			}
			rows = append(rows, x)
			prev = &rows[len(rows)-1]
		}
	}
	return rows, nil
}

// stats is the part of strata's --stats output the bench reads.
type stats struct {
	Host     usage `json:"host"`
	Children usage `json:"children"`
	BytesRd  int64 `json:"checkpoint_bytes_read"`
}

type usage struct {
	User, System float64
	PeakRSS      int64 `json:"peak_rss_bytes"`
}

func (u *usage) UnmarshalJSON(b []byte) error {
	var v struct {
		User    float64 `json:"user_seconds"`
		System  float64 `json:"system_seconds"`
		PeakRSS int64   `json:"peak_rss_bytes"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*u = usage{v.User, v.System, v.PeakRSS}
	return nil
}

// measure runs one export o.runs times.
func (o options) measure(ckpt string, m mode) (x row, err error) {
	var walls, cpus []float64
	x = row{Mode: m.Name}
	steal := startSteal()
	defer func() { x.StealPercent = steal() }()
	for i := range o.runs {
		out := filepath.Join(o.work, fmt.Sprintf("out-%d", i))
		statsPath := filepath.Join(o.work, "stats.json")
		args := append([]string{"--stats", statsPath, "export", ckpt, "--out", out}, m.Args...)
		start := time.Now()
		msg, err := exec.Command(o.strata, args...).CombinedOutput()
		wall := time.Since(start).Seconds()
		if err != nil {
			return row{}, fmt.Errorf("strata %s: %w\n%s", strings.Join(args, " "), err, msg)
		}
		var s stats
		data, err := os.ReadFile(statsPath)
		if err != nil {
			return row{}, err
		}
		if err := json.Unmarshal(data, &s); err != nil {
			return row{}, fmt.Errorf("%s: %w", statsPath, err)
		}
		info, err := os.Stat(filepath.Join(out, "model.onnx"))
		if err != nil {
			return row{}, err
		}
		if x.OtherModelBytes, err = otherModelBytes(out); err != nil {
			return row{}, err
		}
		walls = append(walls, wall)
		cpus = append(cpus, s.Host.User+s.Host.System+s.Children.User+s.Children.System)
		x.HostPeakRSS = max(x.HostPeakRSS, s.Host.PeakRSS)
		x.PluginPeakRSS = max(x.PluginPeakRSS, s.Children.PeakRSS)
		x.BytesRead, x.ModelBytes = s.BytesRd, info.Size()
		x.Layers = layersOf(string(msg))
		if err := os.RemoveAll(out); err != nil {
			return row{}, err
		}
	}
	x.WallSeconds, x.CPUSeconds = median(walls), median(cpus)
	return x, nil
}

// otherModelBytes sums the export's separate models (every *.onnx but model.onnx).
func otherModelBytes(out string) (int64, error) {
	files, err := filepath.Glob(filepath.Join(out, "*.onnx"))
	if err != nil {
		return 0, err
	}
	var n int64
	for _, f := range files {
		if filepath.Base(f) == "model.onnx" {
			continue
		}
		info, err := os.Stat(f)
		if err != nil {
			return 0, err
		}
		n += info.Size()
	}
	return n, nil
}

// layersOf reads "N layers" from strata's summary.
func layersOf(summary string) int {
	var n int
	if i := strings.Index(summary, " layers,"); i > 0 {
		start := strings.LastIndex(summary[:i], " ") + 1
		fmt.Sscanf(summary[start:i], "%d", &n)
	}
	return n
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func strataVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimPrefix(strings.TrimSpace(string(out)), "strata version ")
}

// machine is where the figures were measured.
type machine struct {
	CPU       string `json:"cpu"`
	Cores     int    `json:"cores"`
	MemoryGiB int    `json:"memory_gib"`
	OS        string `json:"os"`
	Go        string `json:"go"`
	Date      string `json:"date"`
}

func describeMachine() machine {
	m := machine{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(),
		Date: time.Now().UTC().Format("2006-01-02")}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		if _, err := fmt.Sscanf(string(data), "MemTotal: %d kB", &kb); err == nil {
			m.MemoryGiB = (kb + 1<<19) >> 20
		}
	}
	return m
}

// startSteal starts measuring CPU steal; the func returns the percentage
// of CPU time stolen since (0 where /proc/stat is missing).
func startSteal() func() float64 {
	s0, t0 := cpuTimes()
	return func() float64 {
		s1, t1 := cpuTimes()
		if t1 <= t0 {
			return 0
		}
		return 100 * float64(s1-s0) / float64(t1-t0)
	}
}

// cpuTimes reads /proc/stat's aggregate steal and total jiffies.
func cpuTimes() (steal, total uint64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			break
		}
		if i < 8 { // user nice system idle iowait irq softirq steal (guest is in user)
			total += v
		}
		if i == 7 {
			steal = v
		}
	}
	return steal, total
}

func (r results) print(w io.Writer) {
	mc := r.Machine
	fmt.Fprintf(w, "strata %s on %s, %d cores, %d GiB, %s, %s; median of %d runs (peak RSS: largest)\n\n",
		r.Strata, mc.CPU, mc.Cores, mc.MemoryGiB, mc.OS, mc.Date, r.Runs)
	fmt.Fprintln(w, "| checkpoint (header-only) | mode | layers | shards | wall | CPU | host peak RSS | plugin peak RSS | read | headers only | model.onnx | other models | steal |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, x := range r.Releases {
		other := "–"
		if x.OtherModelBytes > 0 {
			other = mb(x.OtherModelBytes)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %.2f s | %.2f s | %s | %s | %s | %s | %s | %s | %.0f%% |\n", x.Release, x.Mode, x.Layers, x.Shards,
			x.WallSeconds, x.CPUSeconds, mib(x.HostPeakRSS), mib(x.PluginPeakRSS), kb(x.BytesRead), yesNo(x.BytesRead == x.HeaderBytes), mb(x.ModelBytes), other, x.StealPercent)
	}
	if len(r.Scaling) == 0 {
		return
	}
	fmt.Fprintln(w, "\n| scaling | mode | wall | marginal per layer | host peak RSS | plugin peak RSS | model.onnx | steal |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, x := range r.Scaling {
		marginal := "–"
		if x.MarginalMsPerLyr != 0 {
			marginal = fmt.Sprintf("%.2f ms", x.MarginalMsPerLyr)
		}
		fmt.Fprintf(w, "| %s | %s | %.3f s | %s | %s | %s | %s | %.0f%% |\n", x.Release, x.Mode, x.WallSeconds, marginal,
			mib(x.HostPeakRSS), mib(x.PluginPeakRSS), mb(x.ModelBytes), x.StealPercent)
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
func mb(n int64) string  { return fmt.Sprintf("%.2f MB", float64(n)/1e6) }
func kb(n int64) string  { return fmt.Sprintf("%.1f kB", float64(n)/1e3) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}
