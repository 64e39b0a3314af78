// Package plugins finds strata-plugin-* binaries, starts them through
// go-plugin, asks each what it handles, and stops them all when done.
package plugins

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// BinaryPrefix starts every plugin binary's name: strata-plugin-<name>.
const BinaryPrefix = "strata-plugin-"

// EnvPath lists extra plugin directories, separated like PATH.
const EnvPath = "STRATA_PLUGIN_PATH"

// SearchDir is one place plugins are looked for, and why.
type SearchDir struct {
	Dir    string `json:"dir"`
	Source string `json:"source"` // "--plugin-dir", "STRATA_PLUGIN_PATH", "next to strata", "config dir"
}

// SearchPath lists the directories to search, in precedence order: an
// explicit --plugin-dir first, then STRATA_PLUGIN_PATH, then the directory of
// the strata executable, then the user's config dir. When two plugins claim
// one architecture the earlier wins, so what the user names on the command
// line beats what is installed.
func SearchPath(flagDirs []string) []SearchDir {
	var dirs []SearchDir
	for _, d := range flagDirs {
		dirs = append(dirs, SearchDir{d, "--plugin-dir"})
	}
	for _, d := range filepath.SplitList(os.Getenv(EnvPath)) {
		if d != "" {
			dirs = append(dirs, SearchDir{d, EnvPath})
		}
	}
	if exe, err := os.Executable(); err == nil {
		if resolved, err := filepath.EvalSymlinks(exe); err == nil {
			exe = resolved
		}
		dirs = append(dirs, SearchDir{filepath.Dir(exe), "next to strata"})
	}
	if cfg := configDir(); cfg != "" {
		dirs = append(dirs, SearchDir{filepath.Join(cfg, "strata", "plugins"), "config dir"})
	}
	return dirs
}

// configDir is $XDG_CONFIG_HOME, else ~/.config.
func configDir() string {
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return x
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".config")
	}
	return ""
}

// Candidate is a file that looks like a plugin binary.
type Candidate struct {
	Path   string
	Name   string // the part after strata-plugin-
	Source string
}

// Find lists plugin binaries in dirs, in precedence order. A path found
// twice (the same directory named twice) is listed once.
func Find(dirs []SearchDir) []Candidate {
	var out []Candidate
	seen := map[string]bool{}
	for _, d := range dirs {
		for _, c := range findIn(d) {
			if real, err := filepath.EvalSymlinks(c.Path); err == nil && !seen[real] {
				seen[real] = true
				out = append(out, c)
			}
		}
	}
	return out
}

func findIn(d SearchDir) []Candidate {
	entries, err := os.ReadDir(d.Dir)
	if err != nil {
		return nil
	}
	var out []Candidate
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".exe")
		if !strings.HasPrefix(name, BinaryPrefix) || name == BinaryPrefix {
			continue
		}
		path := filepath.Join(d.Dir, e.Name())
		info, err := os.Stat(path)
		if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			continue
		}
		out = append(out, Candidate{Path: path, Name: strings.TrimPrefix(name, BinaryPrefix), Source: d.Source})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
