package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// archs finding no plugin fails (exit 1), naming every directory it looked
// in; --json still prints the report first.
func TestArchsWithNoPluginFails(t *testing.T) {
	t.Parallel()
	empty, xdg := t.TempDir(), t.TempDir()
	for _, args := range [][]string{{"archs"}, {"archs", "--json"}} {
		cmd := exec.Command(strataBin, append(args, "--plugin-dir", empty)...)
		cmd.Env = append(withoutEnv(os.Environ(), "STRATA_PLUGIN_PATH=", "XDG_CONFIG_HOME="), "XDG_CONFIG_HOME="+xdg)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.Run()
		if code := cmd.ProcessState.ExitCode(); code != 1 {
			t.Errorf("%v: exit %d, want 1", args, code)
		}
		for _, want := range []string{"no strata-plugin-* binaries found; looked in:", empty + " (--plugin-dir)",
			filepath.Dir(strataBin) + " (next to strata)", filepath.Join(xdg, "strata", "plugins") + " (config dir)"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("%v: stderr lacks %q:\n%s", args, want, stderr.String())
			}
		}
		if len(args) == 2 {
			var report archsReport
			if err := json.Unmarshal([]byte(stdout.String()), &report); err != nil || len(report.Plugins) != 0 || len(report.SearchPath) != 3 {
				t.Errorf("archs --json: %v %+v\n%s", err, report, stdout.String())
			}
		}
	}
}

// withoutEnv drops the variables with the given "NAME=" prefixes.
func withoutEnv(env []string, prefixes ...string) []string {
	var out []string
	for _, kv := range env {
		keep := true
		for _, p := range prefixes {
			keep = keep && !strings.HasPrefix(kv, p)
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
