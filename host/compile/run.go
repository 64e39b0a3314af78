package compile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/strata-llm/strata/host/outdir"
	"github.com/strata-llm/strata/internal/contain"
	"github.com/strata-llm/strata/internal/usage"
)

// Write writes the job's files into its directory, rel in d:
// specializations.json, custom_io.yaml, the partition config, and
// compile.sh, which replays the compilation from any working directory.
func (j *Job) Write(d *outdir.Dir, rel, compiler string) error {
	specs, err := pythonJSON(map[string]any{"specializations": j.Specializations})
	if err != nil {
		return err
	}
	files := map[string][]byte{SpecializationsFile: specs, CustomIOFile: j.customIOYAML(), ScriptFile: j.script(compiler)}
	if j.MDP != nil {
		if files[mdpFile(len(j.MDP.Partitions[0].Devices))], err = pythonJSON(j.MDP); err != nil {
			return err
		}
	}
	for name, data := range files {
		mode := os.FileMode(0o644)
		if name == ScriptFile {
			mode = 0o755
		}
		if err := d.WriteFileMode(path.Join(rel, name), data, mode); err != nil {
			return err
		}
	}
	return nil
}

// customIOYAML is the custom-IO list in the compiler's format: a leading
// space, and a blank line after each entry.
func (j *Job) customIOYAML() []byte {
	var b strings.Builder
	for _, c := range j.CustomIO {
		fmt.Fprintf(&b, " - IOName: %s\n   Precision: %s\n\n", c.Name, c.Precision)
	}
	return []byte(b.String())
}

// script is compile.sh: the same command, run from the script's own
// directory (wherever it is called from), the model found relative to it
// (STRATA_MODEL overrides it, e.g. when the directory was moved away from
// its export), the binary directory renamed into place only when the
// compiler succeeds.
func (j *Job) script(compiler string) []byte {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Written by strata compile; replays this compilation from any working directory.\n")
	b.WriteString("# QAIC_COMPILE overrides the compiler, STRATA_MODEL the model (e.g. after moving this directory).\nset -e\n")
	b.WriteString("here=\"$(cd \"$(dirname \"$0\")\" && pwd)\"\n")
	// The default compiler path is single-quoted on its own line: inside
	// "${QAIC_COMPILE:-...}" a $(...) or backquote in it would run.
	fmt.Fprintf(&b, "if [ -z \"${QAIC_COMPILE:-}\" ]; then QAIC_COMPILE=%s; fi\n", shellQuote(compiler))
	fmt.Fprintf(&b, "model=%s\nMODEL=\"${STRATA_MODEL:-$here/$model}\"\n", shellQuote(j.Model))
	b.WriteString("if [ ! -f \"$MODEL\" ]; then\n  echo \"compile.sh: no model at $MODEL: set STRATA_MODEL to the export's model.onnx\" >&2\n  exit 1\nfi\n")
	b.WriteString("cd \"$here\"\n")
	fmt.Fprintf(&b, "rm -rf %s\n\"$QAIC_COMPILE\"", shellQuote(partialBinaryDir))
	for _, a := range j.Args {
		if a == "-m="+j.Model {
			b.WriteString(` "-m=$MODEL"`)
			continue
		}
		b.WriteString(" " + shellQuote(a))
	}
	fmt.Fprintf(&b, "\nrm -rf %s\nmv %s %s\n", shellQuote(BinaryDir), shellQuote(partialBinaryDir), shellQuote(BinaryDir))
	return []byte(b.String())
}

// shellQuote quotes s for POSIX sh: as it is when it holds only characters
// sh never interprets, else in single quotes, where each single quote
// closes the quoting, is written backslash-escaped, and reopens it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_=./,:+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// FindCompiler resolves the qaic-compile binary: the given path, else
// qaic-compile on PATH, else the SDK's install location. Not finding one
// is the invocation's fault (exit 2, as docs/compile.md says): a path that
// is missing, a directory or not executable, or no compiler installed.
func FindCompiler(given string) (string, error) {
	if given != "" {
		if _, err := exec.LookPath(given); err != nil {
			why := err
			if info, serr := os.Stat(given); serr == nil && info.IsDir() {
				why = errors.New("a directory, not the compiler")
			} else if serr == nil && info.Mode().Perm()&0o111 == 0 {
				why = errors.New("not executable (chmod +x it, or name the compiler itself)")
			}
			return "", usage.Errorf("--compiler %s: %v", given, why)
		}
		return filepath.Abs(given)
	}
	if p, err := exec.LookPath("qaic-compile"); err == nil {
		return p, nil
	}
	if _, err := os.Stat(DefaultCompiler); err == nil {
		return DefaultCompiler, nil
	}
	return "", usage.Errorf("qaic-compile not found on PATH or at %s: install the Cloud AI Platform SDK, pass --compiler PATH, or use --dry-run to write the compile files and compile.sh only", DefaultCompiler)
}

// Run runs the compiler in the job's directory, streaming its output, with
// binDir (absolute, not there yet) as its binary directory; the caller puts
// it in place when Run succeeds. A failure reports command and stderr.
func (j *Job) Run(ctx context.Context, compiler, binDir string, stdout, stderr io.Writer) error {
	args := slices.Clone(j.Args)
	for i, a := range args {
		if a == "-aic-binary-dir="+partialBinaryDir {
			args[i] = "-aic-binary-dir=" + binDir
		}
	}
	var tail tailBuffer
	// Contained: Ctrl-C, or strata's death by SIGKILL, ends the compiler and
	// what it started; a child it leaves holding its output is killed
	// when it exits rather than waited for.
	cmd := contain.CommandContext(ctx, compiler, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = j.Dir, stdout, io.MultiWriter(stderr, &tail)
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		code := "could not run"
		if errors.As(err, &exit) {
			code = fmt.Sprintf("exit code %d", exit.ExitCode())
		}
		return fmt.Errorf("compilation failed (%s)\ncommand (in %s): %s %s\nstderr (last lines):\n%s",
			code, j.Dir, compiler, strings.Join(j.Args, " "), tail.String())
	}
	if info, err := os.Lstat(binDir); err != nil || !info.IsDir() {
		return fmt.Errorf("the compiler exited 0 but wrote no binary directory (%s)", binDir)
	}
	return nil
}

// tailBuffer keeps the last 8 KiB written.
type tailBuffer struct{ b bytes.Buffer }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b.Write(p)
	if extra := t.b.Len() - 8<<10; extra > 0 {
		t.b.Next(extra)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return t.b.String() }
