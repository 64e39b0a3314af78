package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/strata-llm/strata/internal/usage"
)

// Location is where a MODEL argument was found: a checkpoint directory, and
// when it came from the Hugging Face cache, the repository and revision.
type Location struct {
	// Dir is the checkpoint directory (a cache snapshot for the cache).
	Dir string
	// HubID is the repository (org/name) when Dir is a cache snapshot.
	HubID string
	// Revision is the ref or commit asked for, Commit the snapshot's commit.
	Revision, Commit string
}

// Name identifies the checkpoint without a path of the machine: the hub id
// (with the commit) for the cache, else the directory's name.
func (l Location) Name() string {
	if l.HubID != "" {
		return l.HubID + "@" + l.Commit
	}
	return filepath.Base(l.Dir)
}

// FromCache reports whether the checkpoint was resolved in the cache.
func (l Location) FromCache() bool { return l.HubID != "" }

// HFCacheDir is the local Hugging Face hub cache, as huggingface_hub finds
// it: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub. It also says which variable decided.
func HFCacheDir() (dir, why string) {
	if d := os.Getenv("HF_HUB_CACHE"); d != "" {
		return d, "HF_HUB_CACHE"
	}
	if d := os.Getenv("HF_HOME"); d != "" {
		return filepath.Join(d, "hub"), "HF_HOME/hub"
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "huggingface", "hub"), "XDG_CACHE_HOME/huggingface/hub"
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", "no home directory"
	}
	return filepath.Join(home, ".cache", "huggingface", "hub"), "the default"
}

// hubID matches org/name (or a bare name) as the Hub spells repositories.
var hubID = regexp.MustCompile(`^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$`)

// Locate resolves MODEL, offline: a checkpoint directory as it is; a
// Hugging Face cache repository directory (models--org--name) to the
// snapshot of revision (default main); a hub id (org/name) to that snapshot
// in the local cache. Nothing is downloaded. revision is an error for a
// plain checkpoint directory.
func Locate(model, revision string) (Location, error) {
	info, statErr := os.Stat(model)
	if statErr == nil && info.IsDir() {
		if isCacheRepo(model) {
			return snapshot(model, repoID(filepath.Base(filepath.Clean(model))), revision)
		}
		if parent := filepath.Dir(filepath.Clean(model)); revision == "" && filepath.Base(parent) == "snapshots" && isCacheRepo(filepath.Dir(parent)) {
			// A snapshot directory itself.
			commit := filepath.Base(filepath.Clean(model))
			return Location{Dir: model, HubID: repoID(filepath.Base(filepath.Dir(parent))), Revision: commit, Commit: commit}, nil
		}
		if revision != "" {
			return Location{}, fmt.Errorf("--revision %s: %s is a checkpoint directory, not a Hugging Face cache repository (models--org--name) or hub id", revision, model)
		}
		return Location{Dir: model}, nil
	}
	if statErr == nil || !errors.Is(statErr, fs.ErrNotExist) || !hubID.MatchString(model) || strings.HasPrefix(model, ".") {
		if revision != "" && statErr != nil {
			return Location{}, fmt.Errorf("checkpoint %s: %w", model, statErr)
		}
		return Location{Dir: model}, nil // Open reports what is wrong
	}
	cache, why := HFCacheDir()
	repo := filepath.Join(cache, "models--"+strings.ReplaceAll(model, "/", "--"))
	if _, err := os.Stat(repo); err != nil {
		fetch := "hf download " + model
		if revision != "" {
			fetch += " --revision " + revision
		}
		return Location{}, fmt.Errorf("%s is not a directory, and the Hugging Face cache has no %s: looked for %s (cache from %s); strata never downloads: fetch it with `%s` (or set HF_HUB_CACHE to the cache that holds it), or pass the checkpoint's directory",
			model, model, repo, why, fetch)
	}
	return snapshot(repo, model, revision)
}

// isCacheRepo reports whether dir is a cache repository directory.
func isCacheRepo(dir string) bool {
	if !strings.HasPrefix(filepath.Base(filepath.Clean(dir)), "models--") {
		return false
	}
	info, err := os.Stat(filepath.Join(dir, "snapshots"))
	return err == nil && info.IsDir()
}

// repoID turns models--org--name back into org/name.
func repoID(base string) string {
	return strings.ReplaceAll(strings.TrimPrefix(base, "models--"), "--", "/")
}

var (
	commitHash = regexp.MustCompile(`^[0-9a-f]{40}$`)
	hexPrefix  = regexp.MustCompile(`^[0-9a-fA-F]+$`)
)

// MinCommitPrefix is the shortest commit prefix --revision takes, as git's
// abbreviations (shorter ones would match by accident).
const MinCommitPrefix = 4

// malformedRevision says why rev cannot name a ref or commit (git's
// check-ref-format rules that matter for a path under refs/), or "".
func malformedRevision(rev string) string {
	switch {
	case rev != filepath.Clean(rev) || strings.HasPrefix(rev, "/") || strings.Contains(rev, ".."):
		return "a path that leaves refs/"
	case strings.HasPrefix(rev, "-") || strings.HasPrefix(rev, ".") || strings.Contains(rev, "/.") ||
		strings.HasSuffix(rev, ".lock") || strings.HasSuffix(rev, ".") || strings.Contains(rev, "@{"):
		return "git does not allow a ref name such as this"
	case strings.ContainsFunc(rev, func(r rune) bool { return r < 0x20 || r == 0x7f || strings.ContainsRune(" ~^:?*[\\", r) }):
		return "a space, control character or one of ~^:?*[\\"
	}
	return ""
}

// snapshot finds revision's snapshot in a cache repository directory: a ref
// (refs/<revision>, default main), a full commit hash, or an unambiguous
// prefix of one (at least MinCommitPrefix hex digits, as git takes). A
// malformed or ambiguous revision is a usage error.
func snapshot(repo, id, revision string) (Location, error) {
	rev := revision
	if rev == "" {
		rev = "main"
	}
	if why := malformedRevision(rev); why != "" {
		return Location{}, usage.Errorf("--revision %q: not a ref name or commit hash (%s); give a ref such as main or a commit hash (at least %d hex digits)", rev, why, MinCommitPrefix)
	}
	loc := Location{HubID: id, Revision: rev}
	commit := ""
	data, found, err := readRef(filepath.Join(repo, "refs", filepath.FromSlash(rev)))
	if err != nil {
		return Location{}, fmt.Errorf("%s: ref %s: %w", repo, rev, err)
	}
	if found {
		commit = strings.TrimSpace(string(data))
		if !commitHash.MatchString(commit) {
			return Location{}, fmt.Errorf("%s: ref %s holds %q, not a commit hash", repo, rev, commit)
		}
		if !isDir(filepath.Join(repo, "snapshots", commit)) {
			return Location{}, fmt.Errorf("%s: ref %s points to commit %s, whose snapshot is missing (an interrupted download?): fetch it again with `hf download %s --revision %s`", repo, rev, commit, id, rev)
		}
	} else {
		snaps := listDirs(filepath.Join(repo, "snapshots"))
		isPrefix := len(rev) >= MinCommitPrefix && hexPrefix.MatchString(rev)
		var matches []string
		for _, s := range snaps {
			if s == rev || isPrefix && strings.HasPrefix(s, strings.ToLower(rev)) {
				matches = append(matches, s)
			}
		}
		switch {
		case len(matches) == 1:
			commit = matches[0]
		case len(matches) > 1:
			return Location{}, usage.Errorf("%s: --revision %s is ambiguous: it begins %d snapshots' commits (%s); give more of the commit hash", repo, rev, len(matches), strings.Join(matches, ", "))
		default:
			refs := listRefs(filepath.Join(repo, "refs"))
			short := ""
			if hexPrefix.MatchString(rev) && len(rev) < MinCommitPrefix {
				short = fmt.Sprintf(" (a commit prefix needs at least %d hex digits)", MinCommitPrefix)
			}
			return Location{}, fmt.Errorf("%s: no ref or snapshot %s%s (refs: %s; snapshots: %s): fetch it with `hf download %s --revision %s`",
				repo, rev, short, orNone(refs), orNone(snaps), id, rev)
		}
	}
	loc.Commit = commit
	loc.Dir = filepath.Join(repo, "snapshots", commit)
	return loc, nil
}

// maxRefBytes bounds a ref file: a commit hash and a newline.
const maxRefBytes = 4096

// readRef reads a ref as the regular file of a few bytes it is; none there
// (or a directory of refs) is no ref. A FIFO, a device or a huge file is an
// error, never waited on or read whole.
func readRef(path string) (data []byte, found bool, err error) {
	data, err = readRegular(path, maxRefBytes)
	var nr *NotRegularError
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.As(err, &nr) && nr.Mode.IsDir():
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return data, true, nil
}

func isDir(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.IsDir()
}

func listDirs(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if isDir(filepath.Join(dir, e.Name())) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

func listRefs(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	sort.Strings(out)
	return out
}

func orNone(v []string) string {
	if len(v) == 0 {
		return "none"
	}
	return strings.Join(v, ", ")
}
