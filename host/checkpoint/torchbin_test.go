package checkpoint

import (
	"archive/zip"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/internal/testbin"
)

// writeBin writes a zip-format torch file whose data.pkl is pkl.
func writeBin(t *testing.T, path string, pkl []byte, storages map[string][]byte) {
	t.Helper()
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	add := func(name string, data []byte) {
		w, err := z.CreateHeader(&zip.FileHeader{Name: "archive/" + name, Method: zip.Store})
		if err != nil {
			t.Fatal(err)
		}
		w.Write(data)
	}
	add("data.pkl", pkl)
	add("byteorder", []byte("little"))
	for k, v := range storages {
		add("data/"+k, v)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBinRefusesAnythingButTensors(t *testing.T) {
	cases := map[string]struct {
		pkl  string
		want string
	}{
		// GLOBAL os.system, BINUNICODE 'ls', TUPLE1, REDUCE, STOP
		"os.system":              {"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.", "asks for os.system, which strata refuses"},
		"builtins.eval":          {"\x80\x02cbuiltins\neval\nX\x01\x00\x00\x001\x85R.", "asks for builtins.eval"},
		"torch but not a tensor": {"\x80\x02ctorch\nload\nX\x01\x00\x00\x00x\x85R.", "asks for torch.load"},
		// EMPTY_DICT, BINUNICODE 'a', BININT1 1, SETITEM, STOP
		"dict of numbers": {"\x80\x02}X\x01\x00\x00\x00aK\x01s.", "is not a named tensor"},
		"a list":          {"\x80\x02].", "not a state dict"},
		"garbage":         {"\x80\x02\xff\xff", "invalid pickle"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			writeBin(t, filepath.Join(dir, binSingle), []byte(tc.pkl), nil)
			_, err := ConvertBin(context.Background(), dir, filepath.Join(t.TempDir(), "out"))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), binSingle) {
				t.Errorf("error %v, want it to name the file and say %q", err, tc.want)
			}
			var refused *RefusedError
			if strings.Contains(tc.want, "asks for") != errors.As(err, &refused) {
				t.Errorf("RefusedError: %v", err)
			}
		})
	}
}

func TestBinNotAZip(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, binSingle), []byte("legacy pickle"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ConvertBin(context.Background(), dir, filepath.Join(t.TempDir(), "out"))
	if err == nil || !strings.Contains(err.Error(), "not a zip-format PyTorch file") {
		t.Errorf("error %v", err)
	}
}

func TestGatherStridedViews(t *testing.T) {
	storage := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11} // 12 one-byte elements
	cases := map[string]struct {
		offset        int64
		shape, stride []int64
		want          []byte
	}{
		"contiguous":  {0, []int64{2, 3}, []int64{3, 1}, []byte{0, 1, 2, 3, 4, 5}},
		"offset":      {6, []int64{2, 3}, []int64{3, 1}, []byte{6, 7, 8, 9, 10, 11}},
		"transposed":  {0, []int64{3, 2}, []int64{1, 3}, []byte{0, 3, 1, 4, 2, 5}},
		"every other": {1, []int64{3}, []int64{2}, []byte{1, 3, 5}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := gather(context.Background(), storage, tc.offset, tc.shape, tc.stride, 1)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("gather = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if _, err := gather(context.Background(), storage, 10, []int64{4}, []int64{1}, 1); err == nil {
		t.Error("a view past its storage was read")
	}
}

// The .bin twin of a fixture converts to the very tensors transformers
// saved as safetensors, and a second conversion reuses the first.
func TestConvertBinTwin(t *testing.T) {
	fixture := filepath.Join(testbin.Root(), "conformance", "fixtures", "llama-bf16-sharded")
	dst := filepath.Join(t.TempDir(), "converted")
	res, err := ConvertBin(context.Background(), filepath.Join(fixture, "model-bin"), dst)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reused || res.Shards != 2 || res.Tensors != 29 {
		t.Errorf("result %+v", res)
	}
	got, want := mustOpen(t, dst), mustOpen(t, filepath.Join(fixture, "model"))
	if !slices.Equal(got.Keys(), want.Keys()) {
		t.Fatalf("keys differ")
	}
	for _, k := range want.Keys() {
		a, _ := got.ReadTensor(k)
		b, _ := want.ReadTensor(k)
		ta, _ := got.Tensor(k)
		tb, _ := want.Tensor(k)
		if !bytes.Equal(a, b) || ta.DType != tb.DType || !slices.Equal(ta.Shape, tb.Shape) || ta.Shard != tb.Shard {
			t.Errorf("tensor %s differs from transformers' safetensors", k)
		}
	}
	again, err := ConvertBin(context.Background(), filepath.Join(fixture, "model-bin"), dst)
	if err != nil || !again.Reused {
		t.Errorf("second conversion: %+v, %v", again, err)
	}
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ConvertBin(context.Background(), filepath.Join(fixture, "model-bin"), foreign); err == nil || !strings.Contains(err.Error(), "did not write") {
		t.Errorf("converted into a directory of other files: %v", err)
	}
}
