package compile

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/strata-llm/strata/host/outdir"
)

// compile.sh must run nothing hidden in a path: every path is quoted so sh
// reads it as a word, never as a command substitution or expansion.
func TestScriptQuotesEveryPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, compiler string }{
		{"command substitution", "/opt/$(touch PWNED)/qaic-compile"},
		{"backquotes", "/opt/`touch PWNED`/qaic-compile"},
		{"single quote", "/opt/it's $(touch PWNED)/qaic-compile"},
		{"variable", "/opt/${HOME:+$(touch PWNED)}/qaic-compile"},
		{"spaces and semicolon", "/opt/a b; touch PWNED/qaic-compile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			d, err := outdir.Open(context.Background(), dir, outdir.Options{Tool: "compile"})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			j := &Job{Dir: dir, Args: []string{"-m=model $(touch PWNED).onnx", "-aic-hw"}}
			if err := j.Write(d, ".", tc.compiler); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sh", filepath.Join(dir, ScriptFile))
			cmd.Env = append(os.Environ(), "QAIC_COMPILE=")
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the script ran a compiler that does not exist:\n%s", out)
			}
			if _, err := os.Stat(filepath.Join(dir, "PWNED")); err == nil {
				t.Fatalf("replaying compile.sh ran a command hidden in a path:\n%s", j.script(tc.compiler))
			}
		})
	}
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain/path-1.onnx": "plain/path-1.onnx",
		"":                  "''",
		"a b":               "'a b'",
		"it's":              `'it'\''s'`,
		"$(x)":              "'$(x)'",
		"`x`":               "'`x`'",
		"a\nb":              "'a\nb'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
