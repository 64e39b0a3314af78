package weights

import "testing"

// FuzzSpec: weight_spec.json is refused or parsed; what parses merges with
// itself (file indices checked, never a panic) and survives a round trip.
func FuzzSpec(f *testing.F) {
	f.Add([]byte(`{"format":"strata.weight_spec","version":1,"producer":{"strata":"dev","plugin":"llama","plugin_version":"0.1.0"},"model_type":"llama","compute_dtype":"float32","mode":"reference","checkpoint":"/c","files":[{"path":"checkpoint/model.safetensors","kind":"checkpoint","source":"model.safetensors","size":100,"link":"hardlink"}],"weights":[{"name":"w","dtype":"BF16","shape":[2],"sources":[{"key":"w","file":0,"offset":8,"length":4,"dtype":"BF16","shape":[2]}]}]}`))
	f.Add([]byte(`{"format":"strata.weight_spec","version":1,"files":[],"weights":[{"name":"w","sources":[{"key":"w","file":5}]}]}`))
	f.Add([]byte(`{"format":"strata.weight_spec","version":1,"files":[{"path":"weights/model.safetensors","kind":"materialized","size":16}],"weights":[{"name":"w","dtype":"FLOAT","shape":[2,2],"sources":[{"key":"a","file":0},{"key":"b","file":0}],"transform":{"op":"stack","args":[{"op":"source","index":0},{"op":"source","index":1}]},"data":{"file":0,"offset":8,"length":16}}]}`))
	f.Add([]byte(`{"format":"strata.weight_spec","version":1,"weights":[{"name":"w","data":{"file":-1}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSpec(data)
		if err != nil {
			return
		}
		merged, err := Merge([]*Spec{s, s})
		if err != nil {
			return
		}
		out, err := merged.Marshal()
		if err != nil {
			return
		}
		if _, err := ParseSpec(out); err != nil {
			t.Fatalf("a merged spec does not parse back: %v\n%s", err, out)
		}
	})
}
