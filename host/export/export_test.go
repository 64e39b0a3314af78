package export

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/progress"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/internal/headeronly"
	"github.com/strata-llm/strata/internal/testbin"
)

var llama, qwen3vl *plugins.Plugin

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "strata-export-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	for _, p := range []string{"llama", "qwen3vl"} {
		if _, err := testbin.Build(dir, "strata-plugin-"+p, "./cmd/strata-plugin-"+p); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	reg := plugins.Load(context.Background(), []plugins.SearchDir{{Dir: dir, Source: "test"}}, plugins.Options{Timeout: time.Minute})
	defer reg.Close()
	if llama, err = reg.For("llama"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if qwen3vl, err = reg.For("qwen3_vl"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// A header-only Llama-3.1-8B (real config, real shard split, data regions
// sparse holes) exports reading config, index and headers only.
func TestHeaderOnlyLlama8BReadsNoTensorData(t *testing.T) {
	config, err := os.ReadFile(filepath.Join(testbin.Root(), "bench", "configs", "llama-3.1-8b", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tensors, err := headeronly.LlamaTensors(config, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	st, err := headeronly.Write(src, config, tensors, 5_000_000_000)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ckpt, err := checkpoint.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), llama, ckpt, Options{Out: filepath.Join(t.TempDir(), "out"), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	index, _ := os.Stat(filepath.Join(src, "model.safetensors.index.json"))
	if want := int64(len(config)) + index.Size() + st.HeaderBytes; ckpt.BytesRead != want {
		t.Errorf("read %d bytes of the checkpoint, want exactly config+index+headers = %d", ckpt.BytesRead, want)
	}
	if len(res.Spec.Weights) != len(tensors) || len(res.Spec.Files) != st.Shards || res.Parameters != 8_030_261_248 {
		t.Errorf("%d weights in %d files, %d parameters; want %d in %d, 8030261248",
			len(res.Spec.Weights), len(res.Spec.Files), res.Parameters, len(tensors), st.Shards)
	}
	t.Logf("Llama-3.1-8B header-only: %s, model.onnx %d bytes, read %d bytes", time.Since(start), res.ModelBytes, ckpt.BytesRead)
}

// The same export twice gives the same bytes.
func TestExportIsByteIdentical(t *testing.T) {
	ckpt, err := checkpoint.Open(filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-bf16-sharded", "model"))
	if err != nil {
		t.Fatal(err)
	}
	var outs [2][]byte
	for i := range outs {
		out := filepath.Join(t.TempDir(), "out")
		if _, err := Run(context.Background(), llama, ckpt, Options{Out: out, Version: "test"}); err != nil {
			t.Fatal(err)
		}
		model, err := os.ReadFile(filepath.Join(out, ModelFile))
		if err != nil {
			t.Fatal(err)
		}
		spec, err := os.ReadFile(filepath.Join(out, SpecFile))
		if err != nil {
			t.Fatal(err)
		}
		outs[i] = append(model, spec...)
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Error("two exports of one checkpoint differ")
	}
}

// Copying shards and materialising weights report progress (plain lines
// here: not a terminal), each phase counting every byte it moves.
func TestLongPhasesReportProgress(t *testing.T) {
	delay, every := progress.Delay, progress.LineEvery
	progress.Delay, progress.LineEvery = 0, time.Millisecond
	t.Cleanup(func() { progress.Delay, progress.LineEvery = delay, every })
	ckpt, err := checkpoint.Open(filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-bf16-sharded", "model"))
	if err != nil {
		t.Fatal(err)
	}
	var shards int64
	for _, sh := range ckpt.Shards {
		shards += sh.Size
	}
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Link: weights.LinkCopy}, fmt.Sprintf("copying shards into checkpoint/: %s of %s (100%%)", progress.Bytes(shards), progress.Bytes(shards))},
		{Options{Weights: weights.Materialize}, "materialising weights/model.safetensors: "},
	} {
		var out strings.Builder
		tc.opts.Out, tc.opts.Version, tc.opts.Progress = filepath.Join(t.TempDir(), "out"), "test", &out
		if _, err := Run(context.Background(), llama, ckpt, tc.opts); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), tc.want) || !strings.Contains(out.String(), "(100%)") {
			t.Errorf("progress %q lacks %q", out.String(), tc.want)
		}
	}
}
