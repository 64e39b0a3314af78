package compile

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-llm/strata/internal/contain"
	"github.com/strata-llm/strata/internal/usage"
)

//go:embed ort.py
var ortScript string

// ORT options: the optimisation level, and whether to also save the ORT format.
type ORT struct {
	Level     string // basic, extended, all
	ORTFormat bool
	Python    string // an interpreter with onnxruntime (default python3)
}

// ORTLevels lists the accepted levels.
var ORTLevels = []string{"basic", "extended", "all"}

// Files the ort backend writes.
const (
	ORTModelFile  = "model.optimized.onnx"
	ORTDataFile   = "model.optimized.data"
	ORTFormatFile = "model.ort"
	ORTReportFile = "ort_report.json"
)

// ORTReport is what the ort backend did.
type ORTReport struct {
	ONNXRuntime      string  `json:"onnxruntime"`
	Level            string  `json:"level"`
	Seconds          float64 `json:"optimize_seconds"`
	ORTFormat        string  `json:"ort_format,omitempty"`
	ORTFormatSkipped string  `json:"ort_format_skipped,omitempty"`
	NodesBefore      int     `json:"nodes_before"`
	NodesAfter       int     `json:"nodes_after"`
	Model            string  `json:"model"`
}

// CheckORT checks, before any export, the level and that the Python
// interpreter exists and imports onnxruntime.
func CheckORT(ctx context.Context, o ORT) error {
	if !slices.Contains(ORTLevels, o.Level) {
		return usage.Errorf("unknown --ort-level %q: use one of %s", o.Level, strings.Join(ORTLevels, ", "))
	}
	python := o.Python
	if python == "" {
		python = "python3"
	}
	if _, err := exec.LookPath(python); err != nil {
		return usage.Errorf("the ort backend runs ONNX Runtime through Python, but --python %s: %v", python, err)
	}
	var stderr bytes.Buffer
	cmd := contain.CommandContext(ctx, python, "-c", "import onnxruntime")
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The invocation's fault, as a missing compiler is (exit 2).
		return usage.Errorf("the ort backend needs onnxruntime in %s, which cannot import it (%v): %s\n(install onnxruntime for it, or pass --python)", python, err, lastLines(stderr.String(), 3))
	}
	return nil
}

// CompileORT optimises m with ONNX Runtime into dir (the caller moves the
// files into place and writes the report): the optimised model
// (initializers over 1 KiB in an external data file) and, when asked and
// possible, the ORT format. ONNX Runtime runs in Python: strata has no
// ONNX Runtime of its own.
func CompileORT(ctx context.Context, m *Model, dir string, o ORT) (*ORTReport, error) {
	if !slices.Contains(ORTLevels, o.Level) {
		return nil, usage.Errorf("unknown --ort-level %q: use one of %s", o.Level, strings.Join(ORTLevels, ", "))
	}
	python := o.Python
	if python == "" {
		python = "python3"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	model, err := filepath.Abs(m.Path)
	if err != nil {
		return nil, err
	}
	args, _ := json.Marshal(map[string]any{
		"model": model, "optimized": filepath.Join(dir, ORTModelFile), "data_name": ORTDataFile,
		"level": o.Level, "ort_format": o.ORTFormat, "ort_path": filepath.Join(dir, ORTFormatFile),
	})
	var stdout, stderr bytes.Buffer
	cmd := contain.CommandContext(ctx, python, "-c", ortScript, string(args))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the ort backend runs ONNX Runtime through %s, which failed (%v): %s\n(install onnxruntime for it, or pass --python)", python, err, lastLines(stderr.String(), 8))
	}
	r := &ORTReport{NodesBefore: m.Nodes, Model: filepath.Join(dir, ORTModelFile)}
	if err := json.Unmarshal(stdout.Bytes(), r); err != nil {
		return nil, fmt.Errorf("the ort backend's report: %w", err)
	}
	optimized, err := CountNodes(r.Model)
	if err != nil {
		return nil, err
	}
	r.NodesAfter = optimized
	return r, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
