package checkpoint

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/binary"
	"testing"
)

// safetensorsFile is a file of a header and data bytes.
func safetensorsFile(header string, data int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, data)...)
}

// FuzzSafetensorsHeader: any file is refused with an error or yields
// tensors that lie inside the file, within their declared sizes.
func FuzzSafetensorsHeader(f *testing.F) {
	f.Add(safetensorsFile(`{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`, 16))
	f.Add(safetensorsFile(`{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"s":{"dtype":"F8_E4M3","shape":[],"data_offsets":[6,7]}}`, 8))
	f.Add(safetensorsFile(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4))
	f.Add(safetensorsFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}`, 8))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, file []byte) {
		var read int64
		header, err := readHeader(bytes.NewReader(file), int64(len(file)), &read, nil)
		if err != nil {
			return
		}
		sh := Shard{Name: "x.safetensors", Size: int64(len(file)), HeaderBytes: 8 + int64(len(header))}
		tensors, err := parseHeader(header, sh)
		if err != nil {
			return
		}
		for _, tn := range tensors {
			if tn.Offset < sh.HeaderBytes || tn.Length < 0 || tn.Offset+tn.Length > sh.Size {
				t.Fatalf("tensor %s at [%d, +%d) outside the %d-byte file", tn.Key, tn.Offset, tn.Length, sh.Size)
			}
			if tn.Elements() < 0 {
				t.Fatalf("tensor %s has %d elements", tn.Key, tn.Elements())
			}
		}
	})
}

// FuzzIndex: an index is refused or names only local shard files.
func FuzzIndex(f *testing.F) {
	f.Add([]byte(`{"metadata":{"total_size":8},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"a":"../evil.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"a":"/etc/passwd"}}`))
	f.Add([]byte(`{"weight_map":{}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ix, err := parseIndex(data)
		if err != nil {
			return
		}
		if len(ix.shards) == 0 || ix.tensors == 0 {
			t.Fatal("an index without shards was accepted")
		}
		for _, n := range ix.shards {
			if checkRelative(n) != nil {
				t.Fatalf("shard name %q leaves the checkpoint", n)
			}
		}
	})
}

// FuzzConfig: config.json is refused or has a model_type.
func FuzzConfig(f *testing.F) {
	f.Add([]byte(`{"model_type":"llama","architectures":["LlamaForCausalLM"],"num_hidden_layers":2}`))
	f.Add([]byte(`{"model_type":3}`))
	f.Add([]byte(`{"model_type":"x","architectures":"X"}`))
	f.Add([]byte(`{"model_type":"x","architectures":[1]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		mt, _, err := parseConfig(data)
		if err == nil && mt == "" {
			t.Fatal("accepted without a model_type")
		}
	})
}

// binArchiveBytes is a torch.save zip of pkl and one storage "0".
func binArchiveBytes(pkl, storage []byte) []byte {
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	for name, data := range map[string][]byte{"data.pkl": pkl, "byteorder": []byte("little"), "data/0": storage} {
		w, _ := z.CreateHeader(&zip.FileHeader{Name: "archive/" + name, Method: zip.Store})
		w.Write(data)
	}
	z.Close()
	return buf.Bytes()
}

// FuzzBinPickle: a pickled state dict and its storage are refused with an
// error or read, never a panic, and never more bytes than the bound on
// amplification allows (DefaultMaxAmplification × the storage).
func FuzzBinPickle(f *testing.F) {
	storage := make([]byte, 16)
	f.Add(tensorPickle(0, []int64{2, 2}, []int64{2, 1}), storage)
	f.Add(tensorPickle(1, []int64{3}, []int64{1}), storage)
	f.Add(tensorPickle(0, []int64{2, 2}, []int64{1, 2}), storage)
	f.Add(tensorPickle(0, []int64{1 << 31, 1 << 31}, []int64{0, 0}), storage)
	f.Add(tensorPickle(0, []int64{-1}, []int64{1}), storage)
	f.Add([]byte("\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R."), storage)
	f.Add([]byte("\x80\x02}X\x01\x00\x00\x00aK\x01s."), []byte{})
	f.Fuzz(func(t *testing.T, pkl, storage []byte) {
		file := binArchiveBytes(pkl, storage)
		a, tensors, err := readBin("fuzz.bin", bytes.NewReader(file), int64(len(file)))
		if err != nil || a.checkAmplification(tensors, DefaultMaxAmplification) != nil {
			return
		}
		total := 0
		for _, tn := range tensors {
			data, err := a.tensorBytes(context.Background(), tn)
			total += len(data)
			if err == nil && total > DefaultMaxAmplification*len(storage) {
				t.Fatalf("tensor %s: %d bytes so far out of a %d-byte storage", tn.key, total, len(storage))
			}
		}
	})
}
