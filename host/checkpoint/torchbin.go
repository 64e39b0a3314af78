package checkpoint

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strings"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"
)

// PyTorch .bin checkpoints are zip archives (torch.save): data.pkl, a pickle
// of the state dict whose tensors point into storages stored uncompressed as
// data/<key>. The pickle is read with github.com/nlpodyssey/gopickle, which
// runs no Python; on top of that strata allows only what rebuilding tensors
// needs and refuses any other global the pickle asks for.

// RefusedError is a pickle asking for something beyond tensor rebuilding.
type RefusedError struct {
	File, Global string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%s: the pickle asks for %s, which strata refuses to load (only tensors and dicts of them are allowed): the file is not a plain state dict, or is malicious", e.File, e.Global)
}

// binTensor is one tensor of a .bin file, located in a storage.
type binTensor struct {
	key     string
	dtype   string // safetensors name
	shape   []int64
	stride  []int64
	offset  int64 // in elements
	storage string
}

// storageClass is torch.<T>Storage: which element type a storage holds.
type storageClass struct{ dtype string }

// storageRef is a persistent storage reference: data/<key> in the archive.
type storageRef struct {
	key   string
	dtype string
}

var storageDTypes = map[string]string{
	"FloatStorage": "F32", "HalfStorage": "F16", "BFloat16Storage": "BF16", "DoubleStorage": "F64",
	"LongStorage": "I64", "IntStorage": "I32", "ShortStorage": "I16", "CharStorage": "I8",
	"ByteStorage": "U8", "BoolStorage": "BOOL",
	"Float8_e4m3fnStorage": "F8_E4M3", "Float8_e5m2Storage": "F8_E5M2",
}

// binArchive is an open .bin file.
type binArchive struct {
	path    string
	r       io.ReaderAt
	zip     *zip.Reader
	file    io.Closer
	prefix  string               // the archive's top directory
	entries map[string]*zip.File // by name, each name once
}

// openBin opens a .bin file (a regular file only: a FIFO never hangs it)
// and reads its tensors' locations.
func openBin(p string) (*binArchive, []binTensor, error) {
	f, info, err := OpenRegular(p)
	if err != nil {
		return nil, nil, err
	}
	a, tensors, err := readBin(p, f, info.Size())
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	a.file = f
	return a, tensors, nil
}

// readBin reads the tensors' locations from a .bin archive of size bytes.
func readBin(name string, r io.ReaderAt, size int64) (*binArchive, []binTensor, error) {
	z, err := zip.NewReader(r, size)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: not a zip-format PyTorch file (torch.save since 1.6): %w", name, err)
	}
	a := &binArchive{path: name, r: r, zip: z}
	tensors, err := a.readPickle()
	if err != nil {
		return nil, nil, err
	}
	return a, tensors, nil
}

func (a *binArchive) Close() error {
	if a.file != nil {
		return a.file.Close()
	}
	return nil
}

func (a *binArchive) find(name string) *zip.File {
	return a.entries[a.prefix+name]
}

// index maps the archive's entries by name. A name twice, or a second
// data.pkl under another directory, is refused: readers disagree on which
// copy counts (torch reads the last, strata would read the first), so what
// strata converts would not be what torch loads.
func (a *binArchive) index() error {
	a.entries = make(map[string]*zip.File, len(a.zip.File))
	var pickles []string
	for _, f := range a.zip.File {
		if _, dup := a.entries[f.Name]; dup {
			return fmt.Errorf("%s: the archive holds %q twice: torch and strata would read different copies, so strata refuses it (torch.save writes each entry once: the file is corrupt or crafted)", a.path, f.Name)
		}
		a.entries[f.Name] = f
		if path.Base(f.Name) == "data.pkl" {
			pickles = append(pickles, f.Name)
			a.prefix = strings.TrimSuffix(f.Name, "data.pkl")
		}
	}
	if len(pickles) > 1 {
		return fmt.Errorf("%s: the archive holds %d pickles (%s): torch and strata could read different ones, so strata refuses it (torch.save writes one data.pkl)", a.path, len(pickles), strings.Join(pickles, ", "))
	}
	return nil
}

func (a *binArchive) readPickle() ([]binTensor, error) {
	if err := a.index(); err != nil {
		return nil, err
	}
	pkl := a.find("data.pkl")
	if pkl == nil {
		return nil, fmt.Errorf("%s: no data.pkl in the archive: not a torch.save file", a.path)
	}
	if order := a.find("byteorder"); order != nil {
		if b, err := readZipFile(order); err != nil || strings.TrimSpace(string(b)) != "little" {
			return nil, fmt.Errorf("%s: byte order %q; only little-endian checkpoints are supported", a.path, b)
		}
	}
	data, err := readZipFile(pkl)
	if err != nil {
		return nil, fmt.Errorf("%s: reading data.pkl: %w", a.path, err)
	}
	if err := checkPickle(data); err != nil {
		return nil, fmt.Errorf("%s: invalid pickle: %w", a.path, err)
	}
	u := pickle.NewUnpickler(strings.NewReader(string(data)))
	var refused error
	u.FindClass = func(module, name string) (any, error) {
		c, err := allowedGlobal(module, name)
		if err != nil {
			refused = &RefusedError{File: a.path, Global: module + "." + name}
			return nil, refused
		}
		return c, nil
	}
	u.PersistentLoad = persistentStorage
	value, err := load(&u)
	if refused != nil {
		return nil, refused
	}
	if err != nil {
		return nil, fmt.Errorf("%s: invalid pickle: %w", a.path, err)
	}
	return stateDict(a.path, value)
}

// load runs the unpickler, turning a panic into an error: gopickle v0.2.0
// indexes its opcode table out of range on some corrupt input.
func load(u *pickle.Unpickler) (v any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("corrupt pickle (%v)", r)
		}
	}()
	return u.Load()
}

// maxPickleBytes bounds data.pkl (a state dict's pickle is kilobytes to a
// few megabytes; the tensor data is elsewhere).
const maxPickleBytes = 256 << 20

func readZipFile(f *zip.File) ([]byte, error) {
	if f.UncompressedSize64 > maxPickleBytes {
		return nil, fmt.Errorf("%s is %d bytes, implausibly large", f.Name, f.UncompressedSize64)
	}
	r, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, maxPickleBytes+1))
	if err == nil && len(data) > maxPickleBytes {
		err = fmt.Errorf("%s holds more than %d bytes, implausibly large", f.Name, maxPickleBytes)
	}
	return data, err
}

// allowedGlobal returns what stands for the few globals a state dict needs.
func allowedGlobal(module, name string) (any, error) {
	switch module + "." + name {
	case "torch._utils._rebuild_tensor_v2":
		return rebuildTensor{}, nil
	case "torch._utils._rebuild_parameter":
		return rebuildParameter{}, nil
	}
	if dt, ok := storageDTypes[name]; ok && module == "torch" {
		return storageClass{dt}, nil
	}
	return nil, errors.New("refused")
}

// persistentStorage reads ('storage', class, key, location, numel).
func persistentStorage(pid any) (any, error) {
	t, ok := pid.(*types.Tuple)
	if !ok || t.Len() < 3 || t.Get(0) != "storage" {
		return nil, fmt.Errorf("unexpected persistent id %v", pid)
	}
	class, ok1 := t.Get(1).(storageClass)
	key, ok2 := t.Get(2).(string)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("unexpected storage reference %v", pid)
	}
	return storageRef{key: key, dtype: class.dtype}, nil
}

// rebuildTensor is torch._utils._rebuild_tensor_v2(storage, offset, size,
// stride, requires_grad, backward_hooks, ...): it only records where the
// tensor lives.
type rebuildTensor struct{}

func (rebuildTensor) Call(args ...any) (any, error) {
	if len(args) < 4 {
		return nil, fmt.Errorf("_rebuild_tensor_v2 with %d arguments", len(args))
	}
	st, ok := args[0].(storageRef)
	offset, ok2 := args[1].(int)
	shape, err1 := intTuple(args[2])
	stride, err2 := intTuple(args[3])
	if !ok || !ok2 || err1 != nil || err2 != nil || len(shape) != len(stride) {
		return nil, fmt.Errorf("_rebuild_tensor_v2 with unexpected arguments")
	}
	t := binTensor{dtype: st.dtype, shape: shape, stride: stride, offset: int64(offset), storage: st.key}
	// The storage's size is checked when its bytes are read; what can be
	// refused without it is refused here, before anything is allocated.
	if _, _, err := checkView(t, math.MaxInt64); err != nil {
		return nil, fmt.Errorf("_rebuild_tensor_v2: %w", err)
	}
	return t, nil
}

// rebuildParameter is torch._utils._rebuild_parameter(data, ...): a
// parameter is its tensor.
type rebuildParameter struct{}

func (rebuildParameter) Call(args ...any) (any, error) {
	if len(args) < 1 {
		return nil, fmt.Errorf("_rebuild_parameter without data")
	}
	if t, ok := args[0].(binTensor); ok {
		return t, nil
	}
	return nil, fmt.Errorf("_rebuild_parameter of something that is not a tensor")
}

func intTuple(v any) ([]int64, error) {
	t, ok := v.(*types.Tuple)
	if !ok {
		return nil, fmt.Errorf("not a tuple")
	}
	out := make([]int64, t.Len())
	for i := range out {
		n, ok := t.Get(i).(int)
		if !ok {
			return nil, fmt.Errorf("not an integer")
		}
		out[i] = int64(n)
	}
	return out, nil
}

// stateDict requires a dict of name -> tensor, in its order.
func stateDict(file string, v any) ([]binTensor, error) {
	var entries []types.DictEntry
	switch d := v.(type) {
	case *types.Dict:
		entries = *d
	case *types.OrderedDict:
		for e := d.List.Front(); e != nil; e = e.Next() {
			o := e.Value.(*types.OrderedDictEntry)
			entries = append(entries, types.DictEntry{Key: o.Key, Value: o.Value})
		}
	default:
		return nil, fmt.Errorf("%s: the pickle holds %T, not a state dict", file, v)
	}
	out := make([]binTensor, 0, len(entries))
	for _, e := range entries {
		key, ok := e.Key.(string)
		t, ok2 := e.Value.(binTensor)
		if !ok || !ok2 {
			return nil, fmt.Errorf("%s: state dict entry %v is not a named tensor", file, e.Key)
		}
		if err := CheckName(key); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		t.key = key
		out = append(out, t)
	}
	return out, nil
}
