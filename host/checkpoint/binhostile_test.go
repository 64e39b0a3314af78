package checkpoint

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/internal/testbin"
)

// convertOne writes archive as dir/pytorch_model.bin and converts it; a
// refusal must leave no output directory behind.
func convertOne(t *testing.T, archive []byte, opts BinOptions) (string, error) {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, binSingle), archive)
	out := filepath.Join(t.TempDir(), "out")
	_, err := ConvertBinWith(context.Background(), dir, out, opts)
	if err != nil {
		if _, serr := os.Stat(out); !os.IsNotExist(serr) {
			t.Errorf("a refused conversion left %s behind", out)
		}
	}
	return out, err
}

// An archive naming an entry twice, or holding two pickles, is refused by
// name: torch reads the last copy, a reader by index the first (issue 30).
func TestBinDuplicateEntriesRefused(t *testing.T) {
	t.Parallel()
	views := []testbin.TorchView{{Key: "w", Storage: "0", Shape: []int64{2}, Stride: []int64{1}}}
	storages := map[string][]byte{"0": testbin.Float32s(1, 2)}
	for _, tc := range []struct {
		name  string
		extra []testbin.ZipEntry
		want  string
	}{
		{"a second archive/data.pkl", []testbin.ZipEntry{{Name: "data.pkl", Data: []byte("\x80\x02}.")}}, `holds "archive/data.pkl" twice`},
		{"a second storage data/0", []testbin.ZipEntry{{Name: "data/0", Data: testbin.Float32s(9, 9)}}, `holds "archive/data/0" twice`},
		{"a pickle under another directory", []testbin.ZipEntry{{Name: "../other/data.pkl", Data: []byte("\x80\x02}.")}}, "holds 2 pickles (archive/data.pkl, archive/../other/data.pkl)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := convertOne(t, testbin.TorchSave(views, storages, tc.extra...), BinOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := convertOne(t, testbin.TorchSave(views, storages), BinOptions{}); err != nil {
		t.Errorf("the same archive without a duplicate: %v", err)
	}
}

// Broadcast (stride 0), overlapping and transposed views are written as
// torch reads them (tensor.contiguous()), each element in full: as_strided
// semantics, checked against torch 2 for such views when written.
func TestBinViewsWrittenAsTorchReadsThem(t *testing.T) {
	t.Parallel()
	storage := testbin.Float32s(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
	cases := []struct {
		view testbin.TorchView
		want []float32
	}{
		// torch.arange(12)[:4].expand(3, 4)
		{testbin.TorchView{Key: "broadcast", Shape: []int64{3, 4}, Stride: []int64{0, 1}}, []float32{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}},
		// stride 0 on a dimension of size 1, from an offset
		{testbin.TorchView{Key: "position_ids", Shape: []int64{1, 6}, Stride: []int64{0, 1}, Offset: 2}, []float32{2, 3, 4, 5, 6, 7}},
		// as_strided((5, 3), (2, 1), 1): rows overlap, 15 elements of 12
		{testbin.TorchView{Key: "overlap", Shape: []int64{5, 3}, Stride: []int64{2, 1}, Offset: 1}, []float32{1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 8, 9, 9, 10, 11}},
		// view(3, 4).t()
		{testbin.TorchView{Key: "transposed", Shape: []int64{4, 3}, Stride: []int64{1, 4}}, []float32{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}},
		// a scalar broadcast to a row
		{testbin.TorchView{Key: "scalar", Shape: []int64{4}, Stride: []int64{0}, Offset: 11}, []float32{11, 11, 11, 11}},
	}
	var views []testbin.TorchView
	for _, c := range cases {
		c.view.Storage = "0"
		views = append(views, c.view)
	}
	// 196 bytes from 48: over the default bound, as a file this small is
	out, err := convertOne(t, testbin.TorchSave(views, map[string][]byte{"0": storage}), BinOptions{MaxAmplification: 5})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := ReadShard(filepath.Join(out, singleFile), singleFile)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(out, singleFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		i := slices.IndexFunc(sh.Tensors, func(x Tensor) bool { return x.Key == c.view.Key })
		if i < 0 {
			t.Fatalf("%s not written", c.view.Key)
		}
		tn := sh.Tensors[i]
		if got, want := data[tn.Offset:tn.Offset+tn.Length], testbin.Float32s(c.want...); !slices.Equal(got, want) || !slices.Equal(tn.Shape, c.view.Shape) {
			t.Errorf("%s: %v %v, want %v", c.view.Key, tn.Shape, got, want)
		}
	}
}

// A .bin of 200,000 keys sharing one 4 KiB storage would write 800 MB:
// refused before anything is written, quickly and in bounded memory,
// naming the storage, its tensors and the figures; --max-amplification
// lets a genuine file with shared storages through (issue 30).
func TestBinAmplificationBounded(t *testing.T) {
	t.Parallel()
	const keys = 200_000
	views := make([]testbin.TorchView, keys)
	for i := range views {
		views[i] = testbin.TorchView{Key: fmt.Sprintf("model.layers.%d.weight", i), Storage: "0", Shape: []int64{1024}, Stride: []int64{1}}
	}
	hostile := testbin.TorchSave(views, map[string][]byte{"0": make([]byte, 4096)})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := convertOne(t, hostile, BinOptions{})
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	for _, want := range []string{"its 200000 tensors would write 819.2 MB from 4.1 kB of storage (200000.0×, more than the 4× strata allows)",
		"storage 0 (4.1 kB) alone is written 819.2 MB by 200000 tensors (model.layers.0.weight, model.layers.1.weight, model.layers.2.weight and 199997 more)",
		"--max-amplification 200000"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v\nwant %q", err, want)
		}
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 2<<30 {
		t.Errorf("refusing it allocated %d MiB", grew>>20)
	}
	t.Logf("%d-byte archive refused in %v (%d MiB allocated)", len(hostile), elapsed, (after.TotalAlloc-before.TotalAlloc)>>20)

	// Tied weights (twice) pass by default; five copies need the option.
	tied := func(n int) []byte {
		v := make([]testbin.TorchView, n)
		for i := range v {
			v[i] = testbin.TorchView{Key: fmt.Sprintf("t%d", i), Storage: "0", Shape: []int64{4}, Stride: []int64{1}}
		}
		return testbin.TorchSave(v, map[string][]byte{"0": testbin.Float32s(1, 2, 3, 4)})
	}
	if _, err := convertOne(t, tied(2), BinOptions{}); err != nil {
		t.Errorf("tied weights: %v", err)
	}
	if _, err := convertOne(t, tied(5), BinOptions{}); err == nil || !strings.Contains(err.Error(), "(5.0×, more than the 4× strata allows)") {
		t.Errorf("five tensors over one storage: %v", err)
	}
	if _, err := convertOne(t, tied(5), BinOptions{MaxAmplification: 5}); err != nil {
		t.Errorf("five tensors over one storage with --max-amplification 5: %v", err)
	}
}

// Tensor names that are not valid UTF-8 are refused, the bytes shown
// escaped, in a .bin pickle and in a safetensors header (where a \u escape
// of a lone surrogate is no character either): JSON would rename them.
func TestNamesMustBeUTF8(t *testing.T) {
	t.Parallel()
	bin := testbin.TorchSave([]testbin.TorchView{{Key: "model.\xffweight", Storage: "0", Shape: []int64{1}, Stride: []int64{1}}},
		map[string][]byte{"0": testbin.Float32s(1)})
	if _, err := convertOne(t, bin, BinOptions{}); err == nil || !strings.Contains(err.Error(), `tensor name "model.\xffweight" is not valid UTF-8 (byte 0xff at offset 6)`) {
		t.Errorf(".bin: %v", err)
	}
	for _, tc := range []struct{ name, header, want string }{
		{"invalid UTF-8", "{\"a.\xc3(\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", `tensor name "a.\xc3(" is not valid UTF-8 (byte 0xc3 at offset 2)`},
		{"a lone high surrogate", `{"a\ud800b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, `holds "\\ud800" at byte 3, an unpaired UTF-16 surrogate`},
		{"a lone low surrogate", `{"a\uDC80":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, `holds "\\uDC80" at byte 3`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := modelDir(t)
			raw(t, filepath.Join(dir, singleFile), tc.header, 4)
			if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	// Valid escapes, a surrogate pair and an escaped backslash, are names.
	dir := modelDir(t)
	raw(t, filepath.Join(dir, singleFile), `{"\u00e9\ud83d\ude00\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 4)
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if keys := ck.Keys(); !slices.Equal(keys, []string{"é😀\\ud800"}) {
		t.Errorf("keys %q", keys)
	}
}
