package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/usage"
)

func TestLocate(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("HF_HUB_CACHE", cache)
	repo := filepath.Join(cache, "models--org--m")
	a, b, c4 := "abcdef01"+strings.Repeat("0", 32), "abcdef02"+strings.Repeat("0", 32), "12345678"+strings.Repeat("0", 32)
	for _, c := range []string{a, b, c4} {
		if err := os.MkdirAll(filepath.Join(repo, "snapshots", c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(repo, "refs", "pr"), 0o755)
	os.WriteFile(filepath.Join(repo, "refs", "main"), []byte(a+"\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "refs", "pr", "1"), []byte(b), 0o644)
	os.WriteFile(filepath.Join(repo, "refs", "broken"), []byte("not a hash"), 0o644)
	os.WriteFile(filepath.Join(repo, "refs", "gone"), []byte(strings.Repeat("f", 40)), 0o644)
	plain := t.TempDir()
	cases := map[string]struct {
		model, rev string
		commit     string // want this snapshot
		err        string // or this error
		usage      bool   // a usage error (exit 2)
	}{
		"hub id, main":       {model: "org/m", commit: a},
		"hub id, nested ref": {model: "org/m", rev: "pr/1", commit: b},
		"repo dir":           {model: repo, commit: a},
		"full commit":        {model: "org/m", rev: b, commit: b},
		"short prefix":       {model: "org/m", rev: "abc", err: "no ref or snapshot abc (a commit prefix needs at least 4 hex digits) (refs: broken, gone, main, pr/1"},
		"ambiguous prefix":   {model: "org/m", rev: "abcdef0", usage: true, err: "is ambiguous: it begins 2 snapshots' commits (" + a + ", " + b + ")"},
		"ambiguous 4":        {model: "org/m", rev: "abcd", usage: true, err: "give more of the commit hash"},
		"4-digit prefix":     {model: "org/m", rev: "1234", commit: c4},
		"upper-case prefix":  {model: "org/m", rev: "ABCDEF02", commit: b},
		"malformed: space":   {model: "org/m", rev: "a b", usage: true, err: `--revision "a b": not a ref name or commit hash`},
		"malformed: dash":    {model: "org/m", rev: "-main", usage: true, err: "not a ref name"},
		"malformed: reflog":  {model: "org/m", rev: "main@{1}", usage: true, err: "not a ref name"},
		"malformed: .lock":   {model: "org/m", rev: "main.lock", usage: true, err: "not a ref name"},
		"prefix":             {model: "org/m", rev: "abcdef02", commit: b},
		"broken ref":         {model: "org/m", rev: "broken", err: `holds "not a hash"`},
		"missing snapshot":   {model: "org/m", rev: "gone", err: "whose snapshot is missing"},
		"escaping revision":  {model: "org/m", rev: "../../x", usage: true, err: "not a ref name or commit hash"},
		"not cached":         {model: "org/other", err: "hf download org/other"},
		"plain dir":          {model: plain},
		"plain dir, rev":     {model: plain, rev: "main", err: "is a checkpoint directory"},
		"relative missing":   {model: "./nope", commit: ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			loc, err := Locate(tc.model, tc.rev)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				if isUsage := errors.As(err, new(usage.Error)); isUsage != tc.usage {
					t.Errorf("usage error %v, want %v: %v", isUsage, tc.usage, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.commit == "" {
				if loc.FromCache() || loc.Dir != tc.model {
					t.Errorf("%+v, want the directory as given", loc)
				}
				return
			}
			if loc.Commit != tc.commit || loc.Dir != filepath.Join(repo, "snapshots", tc.commit) || loc.HubID != "org/m" || loc.Name() != "org/m@"+tc.commit {
				t.Errorf("%+v, want snapshot %s", loc, tc.commit)
			}
		})
	}
}

func TestHFCacheDir(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, tc := range []struct{ hub, hfHome, xdg, want string }{
		{hub: "/h", hfHome: "/x", want: "/h"},
		{hfHome: "/x", xdg: "/c", want: "/x/hub"},
		{xdg: "/c", want: "/c/huggingface/hub"},
		{want: filepath.Join(home, ".cache", "huggingface", "hub")},
	} {
		t.Setenv("HF_HUB_CACHE", tc.hub)
		t.Setenv("HF_HOME", tc.hfHome)
		t.Setenv("XDG_CACHE_HOME", tc.xdg)
		if got, _ := HFCacheDir(); got != tc.want {
			t.Errorf("%+v: got %s", tc, got)
		}
	}
}
