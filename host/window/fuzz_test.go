package window

import (
	"testing"
)

// FuzzManifest: export-manifest.json is refused or parsed; a parsed one
// answers Unchanged without panicking and saves back to what parses.
func FuzzManifest(f *testing.F) {
	f.Add([]byte(`{"format":"strata.export_manifest","version":1,"windows":[{"span":"0-0","first":0,"last":0,"file":"windows/window_0_0.onnx","inputs_sha256":"ab","output_sha256":"cd","files_sha256":{"weights/window_0_0.safetensors":"ef"}}],"model":{"file":"model.onnx","sha256":"00"}}`))
	f.Add([]byte(`{"format":"strata.export_manifest","version":1,"windows":[{"span":"0-1","file":"../../etc/passwd"}]}`))
	f.Add([]byte(`{"format":"strata.export_manifest","version":2}`))
	f.Add([]byte(`{"format":"strata.export_manifest","version":1,"windows":null}`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(data)
		if err != nil {
			return
		}
		m.Unchanged(dir, Span{0, 0, 1}, "ab")
		m.Record(Entry{Span: "0-0", File: "windows/window_0_0.onnx"})
		var saved memWriter
		if err := m.Save(&saved); err != nil {
			t.Fatal(err)
		}
		if _, err := ParseManifest(saved.data); err != nil {
			t.Fatalf("a saved manifest does not parse back: %v", err)
		}
	})
}

type memWriter struct{ data []byte }

func (w *memWriter) WriteFileUnsynced(_ string, data []byte) error {
	w.data = append([]byte(nil), data...)
	return nil
}
