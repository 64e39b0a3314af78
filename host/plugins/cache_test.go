package plugins

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/sdk"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func describeOf(name string) *pb.DescribeResponse {
	return &pb.DescribeResponse{Name: name, ProtocolVersion: sdk.ProtocolVersion,
		Architectures: []*pb.ArchitectureSupport{{ModelType: name}}}
}

// The cache answers for the binary it described, and for nothing else: a
// changed binary, a damaged or foreign entry is a miss, never an error.
func TestDescribeCache(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change acts between store and lookup.
		change     func(t *testing.T, bin, entry string)
		hit        bool
		wantFailed string
	}{
		{name: "as stored", change: func(*testing.T, string, string) {}, hit: true},
		{name: "the binary rewritten", change: func(t *testing.T, bin, _ string) {
			writeExec(t, bin, 0o755) // same bytes, a new modification time
			must(t, os.WriteFile(bin, []byte("#!/bin/sh\n# rebuilt\n"), 0o755))
		}},
		{name: "the binary replaced by rename", change: func(t *testing.T, bin, _ string) {
			writeExec(t, bin+".new", 0o755)
			must(t, os.Rename(bin+".new", bin))
		}},
		{name: "the binary chmodded", change: func(t *testing.T, bin, _ string) { must(t, os.Chmod(bin, 0o700)) }},
		{name: "a corrupt entry", change: func(t *testing.T, _, entry string) { must(t, os.WriteFile(entry, []byte("{\"key\":"), 0o644)) }},
		{name: "an empty entry", change: func(t *testing.T, _, entry string) { must(t, os.WriteFile(entry, nil, 0o644)) }},
		{name: "an entry past the size bound", change: func(t *testing.T, _, entry string) {
			must(t, os.WriteFile(entry, make([]byte, maxEntry+1), 0o644))
		}},
		{name: "an entry of another binary", change: func(t *testing.T, bin, entry string) {
			other := filepath.Join(filepath.Dir(bin), "other")
			writeExec(t, other, 0o755)
			id, _ := identityOf(other)
			store(filepath.Dir(entry), id, describeOf("other"), nil)
			must(t, os.Rename(entryFile(filepath.Dir(entry), id), entry))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin, cache := filepath.Join(t.TempDir(), "strata-plugin-x"), t.TempDir()
			writeExec(t, bin, 0o755)
			id, ok := identityOf(bin)
			if !ok {
				t.Fatal("no identity")
			}
			store(cache, id, describeOf("x"), nil)
			tc.change(t, bin, entryFile(cache, id))
			now, _ := identityOf(bin)
			d, failed := lookup(cache, now)
			if got := d != nil; got != tc.hit || failed != "" {
				t.Fatalf("hit %v (failed %q), want %v", got, failed, tc.hit)
			}
			if tc.hit && !proto.Equal(d, describeOf("x")) {
				t.Errorf("cached %v", d)
			}
		})
	}
}

// A failure is remembered with its reason; a description this strata
// would refuse (another protocol) is not a hit.
func TestDescribeCacheFailuresAndProtocol(t *testing.T) {
	bin, cache := filepath.Join(t.TempDir(), "strata-plugin-x"), t.TempDir()
	writeExec(t, bin, 0o755)
	id, _ := identityOf(bin)
	store(cache, id, nil, os.ErrDeadlineExceeded)
	if d, failed := lookup(cache, id); d != nil || failed != os.ErrDeadlineExceeded.Error() {
		t.Errorf("a failure came back as %v, %q", d, failed)
	}
	old := describeOf("x")
	old.ProtocolVersion = 2
	store(cache, id, old, nil)
	if d, failed := lookup(cache, id); d != nil || failed != "" {
		t.Errorf("a protocol-2 description was a hit: %v %q", d, failed)
	}
}

// Concurrent stratas writing and reading one entry: a reader sees a whole
// entry or none, never a torn one, and no temporary file is left.
func TestDescribeCacheConcurrent(t *testing.T) {
	bin, cache := filepath.Join(t.TempDir(), "strata-plugin-x"), t.TempDir()
	writeExec(t, bin, 0o755)
	id, _ := identityOf(bin)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(2)
		go func() { defer wg.Done(); store(cache, id, describeOf("x"), nil) }()
		go func() {
			defer wg.Done()
			for range 50 {
				if d, _ := lookup(cache, id); d != nil && !proto.Equal(d, describeOf("x")) {
					t.Errorf("reader %d saw %v", i, d)
				}
			}
		}()
	}
	wg.Wait()
	entries, _ := os.ReadDir(cache)
	if len(entries) != 1 {
		t.Errorf("cache holds %d files, want the one entry", len(entries))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
