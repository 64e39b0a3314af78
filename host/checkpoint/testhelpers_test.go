package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// llamaConfig is the smallest config.json Open accepts.
const llamaConfig = `{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}`

// entry is one tensor of a hand-written safetensors header. Extra holds
// fields beyond the three the format defines, to test that they are refused.
type entry struct {
	DType   string
	Shape   []int64
	Offsets [2]int64
	Extra   map[string]any
}

func (e entry) MarshalJSON() ([]byte, error) {
	m := map[string]any{"dtype": e.DType, "shape": e.Shape, "data_offsets": e.Offsets}
	for k, v := range e.Extra {
		m[k] = v
	}
	return json.Marshal(m)
}

// headerJSON encodes entries as a safetensors header with the metadata
// block save_pretrained writes, which the reader must skip. Keys go in
// reverse name order so a reader relying on header order is caught.
func headerJSON(t *testing.T, entries map[string]entry) []byte {
	t.Helper()
	keys := slices.Sorted(maps.Keys(entries))
	slices.Reverse(keys)
	buf := bytes.NewBufferString(`{"__metadata__":{"format":"pt"}`)
	for _, k := range keys {
		name, err := json.Marshal(k)
		if err != nil {
			t.Fatal(err)
		}
		e, err := json.Marshal(entries[k])
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(buf, ",%s:%s", name, e)
	}
	buf.WriteByte('}')
	return buf.Bytes()
}

// writeRaw writes a safetensors file byte by byte: the 8-byte little-endian
// headerLen (which may lie), header, then dataBytes zero bytes.
func writeRaw(t *testing.T, path string, headerLen uint64, header []byte, dataBytes int64) {
	t.Helper()
	buf := binary.LittleEndian.AppendUint64(nil, headerLen)
	buf = append(buf, header...)
	buf = append(buf, make([]byte, dataBytes)...)
	writeFile(t, path, buf)
}

// raw writes a safetensors file of header as given and dataBytes zeros.
func raw(t *testing.T, path, header string, dataBytes int64) {
	t.Helper()
	writeRaw(t, path, uint64(len(header)), []byte(header), dataBytes)
}

// writeShard writes a well-formed safetensors file holding exactly the data
// bytes entries need, and returns the JSON header length.
func writeShard(t *testing.T, path string, entries map[string]entry) int64 {
	t.Helper()
	header := headerJSON(t, entries)
	var end int64
	for _, e := range entries {
		end = max(end, e.Offsets[1])
	}
	writeRaw(t, path, uint64(len(header)), header, end)
	return int64(len(header))
}

// writeIndex writes model.safetensors.index.json with weightMap.
func writeIndex(t *testing.T, dir string, weightMap map[string]string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": weightMap})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, indexFile), b)
}

// modelDir makes a checkpoint directory holding only config.json.
func modelDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, configFile), []byte(llamaConfig))
	return dir
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}
