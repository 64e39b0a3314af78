package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"

	"github.com/buger/jsonparser"
	"github.com/valyala/fastjson"
)

// index is model.safetensors.index.json as the checkpoint reads it: the
// shards it names (sorted), how many tensors, and its bytes, walked again to
// check it against the headers. Nothing of it is kept as a map: Kimi-K2's
// index names 139,583 tensors, and a DOM of it (84 MB allocated) and a map
// of its keys (26 MB) were the peak of its export; two walks of the bytes
// take 5 ms each.
type index struct {
	shards  []string
	tensors int
	data    []byte // nil: no index (a single model.safetensors)
}

// readIndex reads the index, or finds the single model.safetensors.
func (c *Checkpoint) readIndex() (index, error) {
	data, err := c.readFile(indexFile)
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Lstat(c.path(singleFile)); err != nil {
			return index{}, c.noWeightsError()
		}
		return index{shards: []string{singleFile}}, nil
	}
	if err != nil {
		return index{}, inFile(c.path(indexFile), err)
	}
	ix, err := parseIndex(data)
	if err != nil {
		return index{}, fmt.Errorf("%s: %w", c.path(indexFile), err)
	}
	return ix, nil
}

// parseIndex validates the index as JSON (fastjson, without building it)
// and walks its "weight_map" (buger/jsonparser, allocation-free) for the
// shard names.
func parseIndex(data []byte) (index, error) {
	if err := fastjson.ValidateBytes(data); err != nil {
		return index{}, fmt.Errorf("invalid JSON: %w", err)
	}
	if t := jsonType(data); t != jsonparser.Object {
		return index{}, fmt.Errorf("invalid JSON: the index is %s, not an object", t)
	}
	ix := index{data: data}
	seen := map[string]bool{}
	err := eachIndexed(data, func(key, shard []byte) error {
		ix.tensors++
		if !seen[string(shard)] {
			name := string(shard)
			if err := checkRelative(name); err != nil {
				return fmt.Errorf("shard %q: %w", name, err)
			}
			seen[name] = true
			ix.shards = append(ix.shards, name)
		}
		return nil
	})
	if err != nil {
		return index{}, err
	}
	if ix.tensors == 0 {
		return index{}, errors.New("empty or missing \"weight_map\"")
	}
	sort.Strings(ix.shards)
	return ix, nil
}

// jsonType is the type of a valid JSON document's value.
func jsonType(data []byte) jsonparser.ValueType {
	_, t, _, err := jsonparser.Get(data)
	if err != nil {
		return jsonparser.Unknown
	}
	return t
}

// eachIndexed calls f with each weight_map entry's tensor key and shard
// name, both unescaped (valid only during the call). A null or missing
// weight_map has no entries.
func eachIndexed(data []byte, f func(key, shard []byte) error) error {
	wm, t, _, err := jsonparser.Get(data, "weight_map")
	switch {
	case errors.Is(err, jsonparser.KeyPathNotFoundError), err == nil && t == jsonparser.Null:
		return nil
	case err != nil:
		return fmt.Errorf("invalid JSON: %w", err)
	case t != jsonparser.Object:
		return fmt.Errorf("\"weight_map\" is %s, not an object", t)
	}
	var keyBuf, shardBuf []byte
	var failed error
	err = jsonparser.ObjectEach(wm, func(k, v []byte, t jsonparser.ValueType, _ int) error {
		if t != jsonparser.String {
			failed = fmt.Errorf("\"weight_map\": tensor %s: the shard is %s, not a file name", k, t)
			return failed
		}
		key, err := unescaped(k, &keyBuf)
		if err == nil {
			v, err = unescaped(v, &shardBuf)
		}
		if err != nil {
			failed = fmt.Errorf("\"weight_map\": %q: %w", k, err)
			return failed
		}
		if err := f(key, v); err != nil {
			failed = err
			return err
		}
		return nil
	})
	if failed != nil {
		return failed
	}
	if err != nil {
		return fmt.Errorf("\"weight_map\": %w", err)
	}
	return nil
}

// unescaped is a JSON string's contents unescaped (s itself when it has no
// escape), in buf's storage.
func unescaped(s []byte, buf *[]byte) ([]byte, error) {
	if bytes.IndexByte(s, '\\') < 0 {
		return s, nil
	}
	out, err := jsonparser.Unescape(s, (*buf)[:0])
	if err != nil {
		return nil, err
	}
	*buf = out[:0]
	return out, nil
}

// checkIndex verifies that every tensor the index names is where it says.
func (c *Checkpoint) checkIndex(ix index) error {
	if ix.data == nil {
		return nil
	}
	var wrong []string
	err := eachIndexed(ix.data, func(key, file []byte) error {
		t, ok := c.tensors[string(key)]
		switch {
		case !ok:
			wrong = append(wrong, fmt.Sprintf("%s (in no shard; the index says %s)", key, file))
		case t.Shard != string(file):
			wrong = append(wrong, fmt.Sprintf("%s (in %s; the index says %s)", key, t.Shard, file))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(wrong) == 0 {
		return nil
	}
	sort.Strings(wrong)
	more := ""
	if len(wrong) > 3 {
		more = fmt.Sprintf(" and %d more", len(wrong)-3)
		wrong = wrong[:3]
	}
	return fmt.Errorf("%s disagrees with the shard headers: %s%s", c.path(indexFile), strings.Join(wrong, ", "), more)
}
