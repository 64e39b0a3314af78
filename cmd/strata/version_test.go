package main

import (
	"runtime/debug"
	"testing"
)

func TestModuleVersion(t *testing.T) {
	mod := func(v string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Path: "github.com/strata-llm/strata", Version: v}}
	}
	cases := map[string]struct {
		ldflags string
		info    *debug.BuildInfo
		ok      bool
		want    string
	}{
		"go install @version":       {"dev", mod("v0.3.1"), true, "v0.3.1"},
		"ldflags win":               {"v0.3.1-4-gabc", mod("v0.3.0"), true, "v0.3.1-4-gabc"},
		"go run, no VCS":            {"dev", mod("(devel)"), true, "dev"},
		"empty module version":      {"dev", mod(""), true, "dev"},
		"no build info":             {"dev", nil, false, "dev"},
		"pseudo-version from a VCS": {"dev", mod("v0.0.0-20261202090000-1e0383c0e4a1+dirty"), true, "v0.0.0-20261202090000-1e0383c0e4a1+dirty"},
	}
	for name, tc := range cases {
		if got := moduleVersion(tc.ldflags, tc.info, tc.ok); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
}
