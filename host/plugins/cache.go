package plugins

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/sdk"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// The describe cache remembers what each plugin binary said it handles, so
// that a command starts only the plugin it needs (as Packer remembers its
// plugins' descriptions). An entry is keyed by the binary's identity: its
// resolved path, device, inode, size, modification and change times, and
// the plugin protocol of this strata; a binary rebuilt, replaced, touched
// or chmodded is described anew. One file per path, written to a temporary
// name and renamed, so concurrent stratas never see half an entry; an
// entry that does not parse, or names another identity, is ignored.

// cacheEntry is one cache file.
type cacheEntry struct {
	Key      identity `json:"key"`
	Describe []byte   `json:"describe,omitempty"` // a DescribeResponse
	// Failed is why the binary could not be started or described: it
	// fails the same way until it changes (strata archs tries it again).
	Failed string `json:"failed,omitempty"`
}

type identity struct {
	Path     string `json:"path"`
	Dev      uint64 `json:"dev"`
	Ino      uint64 `json:"ino"`
	Size     int64  `json:"size"`
	MtimeNs  int64  `json:"mtime_ns"`
	CtimeNs  int64  `json:"ctime_ns"`
	Protocol int    `json:"protocol"`
}

// maxEntry bounds what is read of an entry: descriptions are small.
const maxEntry = 1 << 20

// DefaultCacheDir is where the describe cache lives: the user's cache
// directory ($XDG_CACHE_HOME, else ~/.cache, on Linux), under strata/plugins.
func DefaultCacheDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "strata", "plugins")
}

// identityOf is path's identity, false when it cannot be read.
func identityOf(path string) (identity, bool) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return identity{}, false
	}
	if real, err = filepath.Abs(real); err != nil {
		return identity{}, false
	}
	info, err := os.Stat(real)
	if err != nil {
		return identity{}, false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return identity{}, false
	}
	return identity{Path: real, Dev: uint64(st.Dev), Ino: st.Ino, Size: info.Size(),
		MtimeNs: info.ModTime().UnixNano(), CtimeNs: ctimeNs(st), Protocol: sdk.ProtocolVersion}, true
}

// entryFile is the cache file of the binary at id.Path.
func entryFile(dir string, id identity) string {
	sum := sha256.Sum256([]byte(id.Path))
	return filepath.Join(dir, hex.EncodeToString(sum[:16])+".json")
}

// lookup returns what the cache in dir holds for id: a description, or
// the error the binary failed with; neither when there is no valid entry.
func lookup(dir string, id identity) (*pb.DescribeResponse, string) {
	if dir == "" {
		return nil, ""
	}
	f, err := os.Open(entryFile(dir, id))
	if err != nil {
		return nil, ""
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxEntry+1))
	var e cacheEntry
	if err != nil || len(data) > maxEntry || json.Unmarshal(data, &e) != nil || e.Key != id {
		return nil, ""
	}
	if e.Failed != "" {
		return nil, e.Failed
	}
	d := &pb.DescribeResponse{}
	if len(e.Describe) == 0 || proto.Unmarshal(e.Describe, d) != nil || validate(d) != nil {
		return nil, ""
	}
	return d, ""
}

// store records in dir what id described (d), or how it failed. Errors are
// ignored: without a cache, plugins are described at every run.
func store(dir string, id identity, d *pb.DescribeResponse, failed error) {
	if dir == "" {
		return
	}
	e := cacheEntry{Key: id}
	if failed != nil {
		e.Failed = failed.Error()
	} else {
		var err error
		if e.Describe, err = proto.Marshal(d); err != nil {
			return
		}
	}
	data, err := json.Marshal(e)
	if err != nil || os.MkdirAll(dir, 0o755) != nil {
		return
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return
	}
	_, err = tmp.Write(data)
	err = errors.Join(err, tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), entryFile(dir, id))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
}
