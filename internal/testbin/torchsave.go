package testbin

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"maps"
	"math"
	"slices"
)

// TorchView is one tensor of a hand-made torch.save archive: a float32
// view (offset, shape, stride in elements) of a storage.
type TorchView struct {
	Key           string
	Storage       string
	Offset        int64
	Shape, Stride []int64
}

// ZipEntry is an archive entry added after the ones TorchSave writes (a
// second data.pkl, a duplicate storage).
type ZipEntry struct {
	Name string // under archive/
	Data []byte
}

// TorchSave builds a torch.save (zip) archive as PyTorch 2 writes it, for
// tests of hostile inputs that torch itself would not write: data.pkl, a
// protocol-2 pickle of the state dict {key: view} in order (globals
// memoised, so 100,000 keys stay a few megabytes), byteorder, and each
// storage as data/<name>, stored uncompressed; then extra, as given.
func TorchSave(views []TorchView, storages map[string][]byte, extra ...ZipEntry) []byte {
	var p bytes.Buffer
	str := func(s string) {
		p.WriteByte('X')
		p.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(s))))
		p.WriteString(s)
	}
	long := func(v int64) {
		p.Write([]byte{0x8a, 8})
		p.Write(binary.LittleEndian.AppendUint64(nil, uint64(v)))
	}
	tuple := func(vs []int64) {
		p.WriteByte('(')
		for _, v := range vs {
			long(v)
		}
		p.WriteByte('t')
	}
	p.WriteString("\x80\x02}(")
	for i, v := range views {
		str(v.Key)
		if i == 0 { // GLOBAL, BINPUT 0 / BINGET 0
			p.WriteString("ctorch._utils\n_rebuild_tensor_v2\nq\x00")
		} else {
			p.WriteString("h\x00")
		}
		p.WriteString("((")
		str("storage")
		if i == 0 {
			p.WriteString("ctorch\nFloatStorage\nq\x01")
		} else {
			p.WriteString("h\x01")
		}
		str(v.Storage)
		str("cpu")
		long(int64(len(storages[v.Storage]) / 4))
		p.WriteString("tQ")
		long(v.Offset)
		tuple(v.Shape)
		tuple(v.Stride)
		p.WriteString("\x89}tR")
	}
	p.WriteString("u.")
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	add := func(name string, data []byte) {
		w, err := z.CreateHeader(&zip.FileHeader{Name: "archive/" + name, Method: zip.Store})
		if err == nil {
			_, err = w.Write(data)
		}
		if err != nil {
			panic(err) // writing to memory
		}
	}
	add("data.pkl", p.Bytes())
	add("byteorder", []byte("little"))
	for _, name := range slices.Sorted(maps.Keys(storages)) {
		add("data/"+name, storages[name])
	}
	for _, e := range extra {
		add(e.Name, e.Data)
	}
	if err := z.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// Float32s is the little-endian bytes of vs.
func Float32s(vs ...float32) []byte {
	out := make([]byte, 0, 4*len(vs))
	for _, v := range vs {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
	}
	return out
}
