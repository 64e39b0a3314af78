package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/internal/contain"
	"github.com/strata-llm/strata/internal/testbin"
	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

var update = flag.Bool("update", false, "rewrite golden files")

// Set up once: the llama plugin, the fakes, and a strata binary for the
// tests that need a real process (signals).
var (
	llamaDir  string            // holds strata-plugin-llama
	qwenDir   string            // holds strata-plugin-qwen3moe
	fakeDirs  map[string]string // mode -> dir holding strata-plugin-fake-<mode>
	strataBin string
	tinyLlama = filepath.Join(testbin.Root(), "examples", "tiny-llama", "model")
)

func TestMain(m *testing.M) {
	contain.Main() // in-process runs contain their plugins and compilers too
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	tmp, err := os.MkdirTemp("", "strata-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	// Plugins are found only where a test says: no config-dir leftovers.
	os.Setenv("XDG_CONFIG_HOME", filepath.Join(tmp, "config"))
	os.Setenv("XDG_CACHE_HOME", filepath.Join(tmp, "cache")) // the describe cache
	os.Unsetenv("STRATA_PLUGIN_PATH")
	llamaDir = filepath.Join(tmp, "llama")
	qwenDir = filepath.Join(tmp, "qwen3moe")
	if err := setup(tmp); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func setup(tmp string) error {
	if _, err := testbin.Build(llamaDir, "strata-plugin-llama", "./cmd/strata-plugin-llama"); err != nil {
		return err
	}
	if _, err := testbin.Build(qwenDir, "strata-plugin-qwen3moe", "./cmd/strata-plugin-qwen3moe"); err != nil {
		return err
	}
	var err error
	fakeDirs, err = testbin.FakePlugins(filepath.Join(tmp, "fakes"),
		"crash-on-start", "hang-on-start", "stdout", "crash-on-plan", "hang-on-plan", "protocol-2", "refuse", "no-layerwise")
	if err != nil {
		return err
	}
	strataBin, err = testbin.Build(filepath.Join(tmp, "host"), "strata", "./cmd/strata")
	return err
}

// inProcess serialises in-process runs of the CLI: urfave/cli writes into
// package-level flags it shares between apps (its help flag) while parsing.
// Tests run in parallel; their in-process CLI calls take turns.
var inProcess sync.Mutex

// strata runs the CLI in-process and returns exit code, stdout and stderr.
func strata(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	inProcess.Lock()
	defer inProcess.Unlock()
	code := run(append([]string{"strata"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// requireNoProcesses fails if any process still runs a binary under dir.
// ownPlugins is a directory of links to the plugins in dir, so that a test
// counting plugin processes counts its own only.
func ownPlugins(t *testing.T, dir string) string {
	t.Helper()
	own := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "strata-plugin-") {
			if err := os.Link(filepath.Join(dir, e.Name()), filepath.Join(own, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	return own
}

func requireNoProcesses(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(testbin.Processes(dir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if pids := testbin.Processes(dir); len(pids) > 0 {
		t.Fatalf("plugin processes still running after strata returned: %v", pids)
	}
}

func TestArchsListsPlugins(t *testing.T) {
	plugins := ownPlugins(t, llamaDir) // its own: other tests' plugins run meanwhile
	t.Parallel()
	code, out, errOut := strata(t, "archs", "--plugin-dir", plugins)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"llama 0.1.0", "strata-plugin-llama", "LlamaForCausalLM", "layerwise: yes", "--plugin-dir"} {
		if !strings.Contains(out, want) {
			t.Errorf("archs output lacks %q:\n%s", want, out)
		}
	}
	requireNoProcesses(t, plugins)
}

func TestArchsJSONKeepsBrokenPluginsApart(t *testing.T) {
	t.Parallel()
	code, out, errOut := strata(t, "archs", "--json", "--plugin-dir", llamaDir, "--plugin-dir", fakeDirs["crash-on-start"],
		"--plugin-dir", fakeDirs["protocol-2"], "--plugin-dir", fakeDirs["stdout"])
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var report archsReport
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("archs --json is not JSON: %v\n%s", err, out)
	}
	byName := map[string]pluginReport{}
	for _, p := range report.Plugins {
		byName[p.Name] = p
	}
	if p := byName["llama"]; p.Error != "" || len(p.Architectures) != 1 || !p.Architectures[0].Capabilities.GetLayerwise() {
		t.Errorf("llama plugin not listed as working: %+v", p)
	}
	for _, broken := range []string{"fake-crash-on-start", "fake-protocol-2", "fake-stdout"} {
		if byName[broken].Error == "" {
			t.Errorf("%s is listed without its error: %+v", broken, byName[broken])
		}
	}
	if !strings.Contains(byName["fake-protocol-2"].Error, "protocol 2") {
		t.Errorf("protocol mismatch not explained: %s", byName["fake-protocol-2"].Error)
	}
}

func TestExportWithoutPluginSaysWhereItLooked(t *testing.T) {
	t.Parallel()
	empty := t.TempDir()
	out := filepath.Join(t.TempDir(), "out")
	code, _, errOut := strata(t, "export", tinyLlama, "--out", out, "--plugin-dir", empty)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []string{"no plugin handles model_type llama", empty, "--plugin-dir"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("error lacks %q:\n%s", want, errOut)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "model.onnx")); err == nil {
		t.Error("model.onnx written although the export failed")
	}
}

func TestExportWritesModelAndSpec(t *testing.T) {
	plugins := ownPlugins(t, llamaDir) // its own: other tests' plugins run meanwhile
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	code, stdout, errOut := strata(t, "export", tinyLlama, "--out", out, "--plugin-dir", plugins)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(stdout, "2 layers") || !strings.Contains(stdout, "headers only") {
		t.Errorf("summary lacks layer count or read report:\n%s", stdout)
	}
	model := readModel(t, filepath.Join(out, "model.onnx"))
	golden(t, "tiny-llama.graph", graphSummary(model))
	requireNoProcesses(t, plugins)

	// A second export into the same directory replaces the first.
	if code, _, errOut := strata(t, "export", tinyLlama, "--out", out, "--plugin-dir", plugins, "--dtype", "float16"); code != 0 {
		t.Fatalf("re-export: exit %d: %s", code, errOut)
	}
	if got := metadata(readModel(t, filepath.Join(out, "model.onnx")))["strata.compute_dtype"]; got != "float16" {
		t.Errorf("re-export compute dtype %q, want float16", got)
	}
}

func readModel(t *testing.T, path string) *onnxpb.ModelProto {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := &onnxpb.ModelProto{}
	if err := proto.Unmarshal(data, m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func metadata(m *onnxpb.ModelProto) map[string]string {
	out := map[string]string{}
	for _, p := range m.GetMetadataProps() {
		out[p.GetKey()] = p.GetValue()
	}
	return out
}

// graphSummary is what a reviewer should see change when the exported graph
// changes: IO, opsets, functions, initializer count, and node counts by op.
func graphSummary(m *onnxpb.ModelProto) string {
	var b strings.Builder
	fmt.Fprintf(&b, "ir_version %d\n", m.GetIrVersion())
	for _, o := range m.GetOpsetImport() {
		fmt.Fprintf(&b, "opset %q %d\n", o.GetDomain(), o.GetVersion())
	}
	io := func(kind string, vs []*onnxpb.ValueInfoProto) {
		for _, v := range vs {
			t := v.GetType().GetTensorType()
			var dims []string
			for _, d := range t.GetShape().GetDim() {
				if d.GetDimParam() != "" {
					dims = append(dims, d.GetDimParam())
				} else {
					dims = append(dims, fmt.Sprint(d.GetDimValue()))
				}
			}
			fmt.Fprintf(&b, "%s %s %s [%s]\n", kind, v.GetName(), onnxpb.TensorProto_DataType(t.GetElemType()), strings.Join(dims, ", "))
		}
	}
	io("input", m.GetGraph().GetInput())
	io("output", m.GetGraph().GetOutput())
	for _, f := range m.GetFunctions() {
		fmt.Fprintf(&b, "function %s.%s (%d nodes)\n", f.GetDomain(), f.GetName(), len(f.GetNode()))
	}
	fmt.Fprintf(&b, "initializers %d\n", len(m.GetGraph().GetInitializer()))
	ops := map[string]int{}
	for _, n := range m.GetGraph().GetNode() {
		ops[n.GetDomain()+":"+n.GetOpType()]++
	}
	keys := make([]string, 0, len(ops))
	for k := range ops {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "op %s %d\n", strings.TrimPrefix(k, ":"), ops[k])
	}
	meta := metadata(m)
	metaKeys := make([]string, 0, len(meta))
	for k := range meta {
		metaKeys = append(metaKeys, k)
	}
	sort.Strings(metaKeys)
	fmt.Fprintf(&b, "metadata %s\n", strings.Join(metaKeys, ", "))
	return b.String()
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (go test -update to accept):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// copyDir copies a small checkpoint so a test may corrupt it.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func editConfig(t *testing.T, dir string, edit func(map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	if data, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestExportRejectsBadInput(t *testing.T) {
	plugins := ownPlugins(t, llamaDir) // its own: other tests' plugins run meanwhile
	t.Parallel()
	shardedFixture := filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-bf16-sharded", "model")
	cases := map[string]struct {
		model   func(t *testing.T) string // checkpoint dir to export
		out     func(t *testing.T) string // --out
		args    []string
		wantErr []string
	}{
		"config without hidden_size": {
			model: func(t *testing.T) string {
				d := copyDir(t, tinyLlama)
				editConfig(t, d, func(c map[string]any) { delete(c, "hidden_size") })
				return d
			},
			wantErr: []string{"config.json", `"hidden_size"`, "missing"},
		},
		"config with unsupported activation": {
			model: func(t *testing.T) string {
				d := copyDir(t, tinyLlama)
				editConfig(t, d, func(c map[string]any) { c["hidden_act"] = "gelu" })
				return d
			},
			wantErr: []string{"hidden_act", "gelu"},
		},
		"config shapes disagree with tensors": {
			model: func(t *testing.T) string {
				d := copyDir(t, tinyLlama)
				editConfig(t, d, func(c map[string]any) { c["intermediate_size"] = 100 })
				return d
			},
			wantErr: []string{"mlp.gate_proj.weight", "has shape", "config.json implies"},
		},
		"truncated shard": {
			model: func(t *testing.T) string {
				d := copyDir(t, tinyLlama)
				truncate(t, filepath.Join(d, "model.safetensors"), 100)
				return d
			},
			wantErr: []string{"model.safetensors", "truncated"},
		},
		"header length past end of file": {
			model: func(t *testing.T) string {
				d := copyDir(t, tinyLlama)
				overwrite(t, filepath.Join(d, "model.safetensors"), 0, []byte{0xff, 0xff, 0xff, 0x00, 0, 0, 0, 0})
				return d
			},
			wantErr: []string{"model.safetensors", "header length", "past the end"},
		},
		"invalid header JSON": {
			model: func(t *testing.T) string {
				d := copyDir(t, tinyLlama)
				overwrite(t, filepath.Join(d, "model.safetensors"), 8, []byte("{oops"))
				return d
			},
			wantErr: []string{"model.safetensors", "invalid header JSON"},
		},
		"index names a missing shard": {
			model: func(t *testing.T) string {
				d := copyDir(t, shardedFixture)
				if err := os.Remove(filepath.Join(d, "model-00002-of-00002.safetensors")); err != nil {
					t.Fatal(err)
				}
				return d
			},
			wantErr: []string{"model.safetensors.index.json", "model-00002-of-00002.safetensors", "missing"},
		},
		"output directory is a file": {
			out: func(t *testing.T) string {
				f := filepath.Join(t.TempDir(), "file")
				if err := os.WriteFile(f, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(f, "out")
			},
			wantErr: []string{"output directory", "cannot be created"},
		},
		"output directory holds other files": {
			out: func(t *testing.T) string {
				d := t.TempDir()
				if err := os.WriteFile(filepath.Join(d, "notes.txt"), []byte("mine"), 0o644); err != nil {
					t.Fatal(err)
				}
				return d
			},
			wantErr: []string{"notes.txt", "which strata export did not write"},
		},
		"unknown dtype":     {args: []string{"--dtype", "int4"}, wantErr: []string{`"int4"`, "float16", "float32"}},
		"unknown link mode": {args: []string{"--link", "hardlinks"}, wantErr: []string{`"hardlinks"`, "hardlink"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model, out := tinyLlama, filepath.Join(t.TempDir(), "out")
			if tc.model != nil {
				model = tc.model(t)
			}
			if tc.out != nil {
				out = tc.out(t)
			}
			args := append([]string{"export", model, "--out", out, "--plugin-dir", plugins}, tc.args...)
			code, _, errOut := strata(t, args...)
			if code == 0 {
				t.Fatal("export succeeded on bad input")
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(errOut, want) {
					t.Errorf("error lacks %q:\n%s", want, errOut)
				}
			}
			if _, err := os.Stat(filepath.Join(out, "model.onnx")); err == nil {
				t.Error("a model.onnx was written although the export failed")
			}
			if _, err := os.Stat(out); tc.out == nil && err == nil {
				t.Error("the output directory this export created is still there after it failed")
			}
			requireNoProcesses(t, plugins)
		})
	}
}

// overwrite replaces bytes of path at offset.
func overwrite(t *testing.T, path string, offset int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, offset); err != nil {
		t.Fatal(err)
	}
}

func truncate(t *testing.T, path string, by int64) {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, info.Size()-by); err != nil {
		t.Fatal(err)
	}
}

func TestMisbehavingPlugins(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		mode    string
		args    []string
		wantErr []string
	}{
		"crashes during plan": {mode: "crash-on-plan", wantErr: []string{"strata-plugin-fake-crash-on-plan", "Plan", "stopped responding"}},
		"hangs during plan":   {mode: "hang-on-plan", args: []string{"--plugin-timeout", "2s"}, wantErr: []string{"strata-plugin-fake-hang-on-plan", "did not answer within 2s", "--plugin-timeout"}},
		"refuses the model":   {mode: "refuse", wantErr: []string{"cannot export this checkpoint", "refuses every checkpoint"}},
		"fails to start":      {mode: "crash-on-start", wantErr: []string{"no plugin handles model_type llama", "strata-plugin-fake-crash-on-start failed"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			args := append(append([]string{}, tc.args...), "export", tinyLlama, "--out", out, "--plugin-dir", fakeDirs[tc.mode])
			start := time.Now()
			code, _, errOut := strata(t, args...)
			if code != 1 {
				t.Fatalf("exit %d, want 1:\n%s", code, errOut)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(errOut, want) {
					t.Errorf("error lacks %q:\n%s", want, errOut)
				}
			}
			if _, err := os.Stat(filepath.Join(out, "model.onnx")); err == nil {
				t.Error("model.onnx written")
			}
			requireNoProcesses(t, fakeDirs[tc.mode])
			t.Logf("failed cleanly in %s", time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestInterruptStopsPluginsAndWritesNothing sends Ctrl-C (SIGINT) to a real
// strata process while its plugin is busy.
func TestInterruptStopsPluginsAndWritesNothing(t *testing.T) {
	plugins := ownPlugins(t, fakeDirs["hang-on-plan"]) // its own: other tests hang this plugin too
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command(strataBin, "export", tinyLlama, "--out", out, "--plugin-dir", plugins)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return slices.ContainsFunc(testbin.Processes(plugins), func(pid int) bool { return pid != cmd.Process.Pid })
	}) // the plugin, not strata
	time.Sleep(300 * time.Millisecond) // let the host reach the Plan call
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Fatalf("strata exited with %v, want code 130; stderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("no interruption message:\n%s", stderr.String())
	}
	if _, err := os.Stat(filepath.Join(out, "model.onnx")); err == nil {
		t.Error("model.onnx written after Ctrl-C")
	}
	requireNoProcesses(t, plugins)
}

// TestKilledHostLeavesNoPlugin: even SIGKILL, which strata cannot handle,
// takes the plugin down with it.
func TestKilledHostLeavesNoPlugin(t *testing.T) {
	plugins := ownPlugins(t, fakeDirs["hang-on-plan"]) // its own: other tests hang this plugin too
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command(strataBin, "export", tinyLlama, "--out", out, "--plugin-dir", plugins)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return slices.ContainsFunc(testbin.Processes(plugins), func(pid int) bool { return pid != cmd.Process.Pid })
	}) // the plugin, not strata
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	requireNoProcesses(t, plugins)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		args []string
		want string
	}{
		"export without model": {[]string{"export", "--out", "x"}, "exactly one argument, MODEL"},
		"export without out":   {[]string{"export", tinyLlama}, `"out"`},
		"inspect two dirs":     {[]string{"inspect", "a", "b"}, "exactly one argument"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, _, errOut := strata(t, tc.args...)
			if code == 0 || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant it to mention %q", code, errOut, tc.want)
			}
		})
	}
}

func TestInspect(t *testing.T) {
	t.Parallel()
	code, out, errOut := strata(t, "inspect", "--json", tinyLlama, "--plugin-dir", llamaDir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r inspectReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.ModelType != "llama" || r.Plugin == nil || r.Plugin.Name != "llama" || r.Layers != 2 ||
		!r.Supported || !r.LayerwiseSupported || len(r.Shards) != 1 || r.DTypes[0].DType != "BF16" {
		t.Errorf("unexpected report: %+v", r)
	}
	// 8 heads × 8 dims, 2 kv heads, hidden 64, intermediate 96, vocab 128, untied.
	const params = 128*64*2 + 64 + 2*(64*64+2*16*64+64*64+3*64*96+2*64)
	if r.Parameters != params {
		t.Errorf("parameters %d, want %d", r.Parameters, params)
	}
	code, text, _ := strata(t, "inspect", tinyLlama, "--plugin-dir", llamaDir)
	if code != 0 || !strings.Contains(text, "decoder ×2") || !regexp.MustCompile(`layerwise_supported\s+yes`).MatchString(text) {
		t.Errorf("text report:\n%s", text)
	}
}

// Two plugins claim llama: the one found first (here the first --plugin-dir)
// is used, and archs says the other is not.
func TestFirstPluginFoundWins(t *testing.T) {
	t.Parallel()
	code, out, _ := strata(t, "archs", "--plugin-dir", fakeDirs["refuse"], "--plugin-dir", llamaDir)
	if code != 0 || !strings.Contains(out, "not used: "+filepath.Join(fakeDirs["refuse"], "strata-plugin-fake-refuse")) {
		t.Errorf("archs does not say which plugin wins:\n%s", out)
	}
	code, _, errOut := strata(t, "export", tinyLlama, "--out", filepath.Join(t.TempDir(), "o"),
		"--plugin-dir", fakeDirs["refuse"], "--plugin-dir", llamaDir)
	if code == 0 || !strings.Contains(errOut, "refuses every checkpoint") {
		t.Errorf("export did not use the first plugin found: exit %d\n%s", code, errOut)
	}
}

// onSmallFilesystem runs strata export with --out on a fresh tmpfs of the
// given size, in a user+mount namespace (no root needed), and lists what the
// failed export left there.
func onSmallFilesystem(t *testing.T, size string, args ...string) (code int, stderr, leftovers string) {
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("this test needs util-linux's unshare: %v", err)
	}
	mnt := t.TempDir()
	script := `mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99
"$3" export "$4" --out "$2/out" --plugin-dir "$5" "${@:6}"; code=$?
echo "left:"; ls -A "$2/out" 2>/dev/null; exit $code`
	cmd := exec.Command("unshare", append([]string{"-rm", "bash", "-c", script, "bash", size, mnt, strataBin, tinyLlama, llamaDir}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	if code = cmd.ProcessState.ExitCode(); code == 99 {
		t.Fatalf("cannot mount a tmpfs in a user namespace: %s", errOut.String())
	}
	_, left, _ := strings.Cut(out.String(), "left:\n")
	return code, errOut.String(), left
}

func TestOutputOnAnotherFilesystem(t *testing.T) {
	t.Parallel()
	code, stderr, left := onSmallFilesystem(t, "4m", "--link", "hardlink")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, stderr)
	}
	for _, want := range []string{"cannot hard-link", "different filesystems", "--link copy", "--link symlink"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("error lacks %q:\n%s", want, stderr)
		}
	}
	if strings.TrimSpace(left) != "" {
		t.Errorf("the failed export left %q", left)
	}
	// The documented fallback works there, and is what --link auto (the
	// default) does, saying so.
	if code, stderr, _ := onSmallFilesystem(t, "4m", "--link", "copy"); code != 0 {
		t.Errorf("--link copy on another filesystem: exit %d\n%s", code, stderr)
	}
	if code, stderr, _ := onSmallFilesystem(t, "4m"); code != 0 || !strings.Contains(stderr, "shards copied") {
		t.Errorf("--link auto on another filesystem: exit %d\n%s", code, stderr)
	}
}

// A small file system (a tmpfs in a user namespace): what cannot fit is
// refused before the first byte, with the figures; a disk that fills
// mid-run anyway (files take whole pages: at 160-192k the shard passes the
// check, then its copy or model.onnx finds no room) names ENOSPC and what
// to do. The new --out is gone either way.
func TestFullDisk(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, size string
		args       []string
		want       []string
	}{
		{"copies refused up front", "64k", []string{"--link", "copy"}, []string{"this export would take ", " of copied shards and the file system of ", " free: free ", "--link auto"}},
		{"materialised weights refused up front", "64k", []string{"--weights", "materialize"}, []string{"this export would take ", " of materialised weights and ", "the file system of ", " free: free ", "--weights reference"}},
		{"full mid-run", "176k", []string{"--link", "copy"}, []string{"no space left on device", ": make room on the file system of ", "or export to another --out"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, stderr, left := onSmallFilesystem(t, tc.size, tc.args...)
			if code != 1 {
				t.Fatalf("exit %d, want 1:\n%s", code, stderr)
			}
			for _, want := range tc.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("the error lacks %q:\n%s", want, stderr)
				}
			}
			if strings.TrimSpace(left) != "" {
				t.Errorf("the failed export left %q", left)
			}
		})
	}
}

// --stats reports the command's wall and CPU time, the host's and the
// plugins' peak RSS apart, and the checkpoint bytes the export read;
// --cpuprofile and --memprofile write pprof files.
func TestStatsAndProfiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	statsPath := filepath.Join(dir, "stats.json")
	code, _, errOut := strata(t, "--stats", statsPath, "--cpuprofile", filepath.Join(dir, "cpu.prof"),
		"--memprofile", filepath.Join(dir, "mem.prof"), "export", tinyLlama, "--out", filepath.Join(dir, "out"), "--plugin-dir", llamaDir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, name := range []string{"cpu.prof", "mem.prof"} {
		if len(read(t, filepath.Join(dir, name))) == 0 {
			t.Errorf("%s is empty", name)
		}
	}
	var s runStats
	if err := json.Unmarshal(read(t, statsPath), &s); err != nil {
		t.Fatal(err)
	}
	if s.Command != "export" || s.WallSeconds <= 0 || s.Host.UserSeconds+s.Host.SystemSeconds <= 0 {
		t.Errorf("stats %+v", s)
	}
	if s.CheckpointBytesRead == nil || *s.CheckpointBytesRead <= 0 || *s.CheckpointBytesRead > 10_000 {
		t.Errorf("checkpoint bytes read %v, want the tiny model's headers", s.CheckpointBytesRead)
	}
	if runtime.GOOS == "linux" && (s.Host.PeakRSSBytes <= 0 || s.Children.PeakRSSBytes <= 0) {
		t.Errorf("peak RSS host %d, plugins %d", s.Host.PeakRSSBytes, s.Children.PeakRSSBytes)
	}
}
