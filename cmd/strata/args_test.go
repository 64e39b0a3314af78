package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

func TestInterspersed(t *testing.T) {
	t.Parallel()
	app := newApp(io.Discard, io.Discard)
	cases := map[string]struct{ in, want string }{
		"flags after the model":        {"export M --out D --dtype float16", "export --out D --dtype float16 M"},
		"global flag after subcommand": {"export M --plugin-dir P --out D", "--plugin-dir P export --out D M"},
		"global bool flag":             {"inspect M -v --json", "-v inspect --json M"},
		"name=value form":              {"export M --out=D", "export --out=D M"},
		"already in order":             {"-v export --out D M", "-v export --out D M"},
		"after --":                     {"export M -- --out", "export M -- --out"},
		"unknown command":              {"frobnicate --x M", "frobnicate --x M"},
		"global flag before command":   {"--plugin-timeout 5s archs --json", "--plugin-timeout 5s archs --json"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := interspersed(app, append([]string{"strata"}, strings.Fields(tc.in)...))
			if want := append([]string{"strata"}, strings.Fields(tc.want)...); !slices.Equal(got, want) {
				t.Errorf("interspersed(%q) = %q, want %q", tc.in, got[1:], want[1:])
			}
		})
	}
}

func TestInterspersedHelpAndPluginOptions(t *testing.T) {
	t.Parallel()
	app := newApp(io.Discard, io.Discard)
	cases := map[string]struct{ in, want string }{
		"help before a global flag":        {"export --help --plugin-dir P", "--plugin-dir P export --help"},
		"plugin option with a value":       {"export M --moe-strategy dense --out D", "export --plugin-option moe_strategy=dense --out D M"},
		"plugin option then a flag":        {"export M --bogus --out D", "export --plugin-option bogus --out D M"},
		"plugin option, name=value":        {"compile M --moe-strategy=gather", "compile --plugin-option moe_strategy=gather M"},
		"negative plugin option value":     {"export M --offset -1", "export --plugin-option offset=-1 M"},
		"qwen3vl vision inputs":            {"export M --vision true --extra-model vision", "export --plugin-option vision=true --extra-model vision M"},
		"a bare option before a flag":      {"export M --vision --out D", "export --plugin-option vision --out D M"},
		"a bare option at the end":         {"export M --out D --vision", "export --out D --plugin-option vision M"},
		"a bare option before MODEL":       {"export --vision org/m --out D", "export --plugin-option vision --out D org/m"},
		"a value, MODEL missing":           {"export --moe-strategy dense --out D", "export --plugin-option moe_strategy=dense --out D"},
		"a value, then MODEL":              {"export --moe-strategy dense M --out D", "export --plugin-option moe_strategy=dense --out D M"},
		"a typo of a flag is the parser's": {"export M --out D --layerwsie", "export --out D --layerwsie M"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := interspersed(app, append([]string{"strata"}, strings.Fields(tc.in)...))
			if want := append([]string{"strata"}, strings.Fields(tc.want)...); !slices.Equal(got, want) {
				t.Errorf("interspersed(%q) = %q, want %q", tc.in, got[1:], want[1:])
			}
		})
	}
}
