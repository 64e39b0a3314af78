package main

import "runtime/debug"

// A binary built by `go install github.com/strata-llm/strata/cmd/...@v1.2.3`
// carries its module version (a checkout's build, when Go stamps VCS
// information, a pseudo-version); -ldflags "-X main.version=..." (make
// build) still wins.
func init() {
	info, ok := debug.ReadBuildInfo()
	version = moduleVersion(version, info, ok)
}

// moduleVersion is the version strata reports: the one set by ldflags, else
// the main module's from the build info, else "dev".
func moduleVersion(ldflags string, info *debug.BuildInfo, ok bool) string {
	if ldflags != "dev" || !ok || info == nil {
		return ldflags
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	return ldflags
}
