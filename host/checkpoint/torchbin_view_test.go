package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// pickleLong is LONG1 with 8 bytes: any int64.
func pickleLong(v int64) []byte {
	b := []byte{0x8a, 8}
	return binary.LittleEndian.AppendUint64(b, uint64(v))
}

func pickleString(s string) []byte {
	b := []byte{'X'}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

func pickleTuple(vs []int64) []byte {
	b := []byte{'('}
	for _, v := range vs {
		b = append(b, pickleLong(v)...)
	}
	return append(b, 't')
}

// tensorPickle is a state dict {"w": a float32 tensor view of storage "0"}.
func tensorPickle(offset int64, shape, stride []int64) []byte {
	var b bytes.Buffer
	b.WriteString("\x80\x02}")
	b.Write(pickleString("w"))
	b.WriteString("ctorch._utils\n_rebuild_tensor_v2\n(")
	b.WriteString("(")
	b.Write(pickleString("storage"))
	b.WriteString("ctorch\nFloatStorage\n")
	b.Write(pickleString("0"))
	b.Write(pickleString("cpu"))
	b.Write(pickleLong(4))
	b.WriteString("tQ")
	b.Write(pickleLong(offset))
	b.Write(pickleTuple(shape))
	b.Write(pickleTuple(stride))
	b.WriteString("\x89}tRs.")
	return b.Bytes()
}

// Pickled views are validated before anything is allocated: no panic, no
// huge allocation, no file left behind.
func TestBinViewsAreValidated(t *testing.T) {
	t.Parallel()
	storage := make([]byte, 16) // 4 float32 elements
	const huge = int64(1) << 31
	for _, tc := range []struct {
		name          string
		offset        int64
		shape, stride []int64
		want          string
	}{
		{"negative shape", 0, []int64{-1}, []int64{1}, "negative size or stride"},
		{"huge shape", 0, []int64{math.MaxInt64}, []int64{1}, "reaches element"},
		{"overflowing shape", 0, []int64{huge, huge, huge}, []int64{1, 1, 1}, "too many elements"},
		{"zero strides", 0, []int64{huge, huge}, []int64{0, 0}, "more than the 4× strata allows"},
		{"negative stride", 0, []int64{2}, []int64{-1}, "negative size or stride"},
		{"negative offset", -1, []int64{2}, []int64{1}, "negative storage offset"},
		{"past the storage", 3, []int64{2}, []int64{1}, "reaches element 4 of a storage of 4"},
		{"stride overflow", 0, []int64{3}, []int64{math.MaxInt64/2 + 1}, "reaches past any storage"},
		{"rank mismatch", 0, []int64{2, 2}, []int64{1}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeBin(t, filepath.Join(dir, binSingle), tensorPickle(tc.offset, tc.shape, tc.stride), map[string][]byte{"0": storage})
			out := filepath.Join(t.TempDir(), "out")
			_, err := ConvertBin(context.Background(), dir, out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				entries, _ := os.ReadDir(out)
				t.Fatalf("a failed conversion left %s behind: %v", out, entries)
			}
		})
	}
	t.Run("valid view converts", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		writeBin(t, filepath.Join(dir, binSingle), tensorPickle(1, []int64{3}, []int64{1}), map[string][]byte{"0": storage})
		out := filepath.Join(t.TempDir(), "out")
		if _, err := ConvertBin(context.Background(), dir, out); err != nil {
			t.Fatal(err)
		}
		info, err := os.Stat(filepath.Join(out, singleFile))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm()&0o044 == 0 {
			t.Errorf("converted shard has mode %v: not readable like the rest (0644 less the umask)", info.Mode().Perm())
		}
	})
}

// A pickle that declares more bytes than it has is refused before the
// unpickler allocates them (found by FuzzBinPickle: gigabytes per input).
func TestBinPickleLengthsAreBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, pkl string }{
		{"BINUNICODE of 4 GiB", "\x80\x02X\xf0\xff\xff\xff.."},
		{"BINBYTES8 of 1 TiB", "\x80\x04\x8e\x00\x00\x00\x00\x00\x01\x00\x00."},
		{"FRAME of 1 TiB", "\x80\x04\x95\x00\x00\x00\x00\x00\x01\x00\x00}."},
		{"LONG4 of 2 GiB", "\x80\x02\x8b\x00\x00\x00\x80."},
		{"no STOP", "\x80\x02}"},
		{"unknown opcode", "\x80\x02\xff."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			dir := t.TempDir()
			writeBin(t, filepath.Join(dir, binSingle), []byte(tc.pkl), nil)
			_, err := ConvertBin(context.Background(), dir, filepath.Join(t.TempDir(), "out"))
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), "corrupt pickle") {
				t.Fatalf("error %v", err)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<20 {
				t.Errorf("refusing it allocated %d MiB", grew>>20)
			}
		})
	}
}
