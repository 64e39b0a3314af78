package outdir

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
)

// The encoder's bytes are json.Marshal's, through a run of edits that add,
// change and drop paths (HTML-escaped and non-ASCII names among them).
func TestManifestEncoderIsJSONMarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"model.onnx", "checkpoint/a<b>&c.safetensors", "windows/window_0_0.onnx", "é/ü", `q"uote\`, "weights/x.data"}
	var enc manifestEncoder
	m := manifest{Format: manifestFormat, Version: manifestVersion, Tool: "export", Entries: map[string][]Entry{}}
	for step := range 300 {
		p := fmt.Sprintf("%s.%d", names[rng.IntN(len(names))], rng.IntN(20))
		switch rng.IntN(4) {
		case 0:
			delete(m.Entries, p)
		case 1:
			m.Entries[p] = append(m.Entries[p], Entry{Kind: kindLink, Dev: rng.Uint64(), Ino: rng.Uint64()})
		default:
			m.Entries[p] = []Entry{{Kind: kindFile, Dev: 1, Ino: uint64(step), Size: rng.Int64N(1 << 40), MtimeNs: rng.Int64(), Target: names[rng.IntN(len(names))]}}
		}
		m.Sessions = nil
		if step%3 == 0 {
			m.Sessions = []string{fmt.Sprintf("s%d", step)}
		}
		got, err := enc.encode(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("step %d: encoded\n%s\nwant\n%s", step, got, want)
		}
	}
	for _, m := range []manifest{{Format: "f", Entries: nil}, {Format: "f", Entries: map[string][]Entry{}}, {Format: "f", Entries: map[string][]Entry{"a": nil}}} {
		got, _ := enc.encode(m)
		want, _ := json.Marshal(m)
		if string(got) != string(want) {
			t.Errorf("encoded %s, want %s", got, want)
		}
	}
}
