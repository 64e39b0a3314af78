package build

import (
	"encoding/json"
	"math"
	"os"
	"testing"

	"github.com/strata-llm/strata/sdk/hf"
	"github.com/strata-llm/strata/sdk/refeval"
)

// Values computed by transformers 5.24 (torch float32, CPU) with
// testdata/gen_rope.py, which documents how to regenerate them.
type ropeReference struct {
	Transformers string `json:"transformers"`
	Yarn         []struct {
		Name            string          `json:"name"`
		Config          json.RawMessage `json:"config"`
		HeadDim         int             `json:"head_dim"`
		InvFreqBits     []int32         `json:"inv_freq_bits"`
		PosFreqsBits    []int32         `json:"pos_freqs_bits"`
		AttentionFactor float64         `json:"attention_factor"`
		Positions       []int64         `json:"positions"`
		Cos, Sin        []float64
	} `json:"yarn"`
	MRoPE struct {
		Config      json.RawMessage `json:"config"`
		HeadDim     int             `json:"head_dim"`
		PositionIDs [][][]int64     `json:"position_ids"` // [3][B][S]
		Cos, Sin    []float64
	} `json:"mrope"`
	SwiGLU struct {
		Alpha, Limit float64
		Shape        []int64
		Gate32       []float32 `json:"gate_float32"`
		Up32         []float32 `json:"up_float32"`
		Out32        []float64 `json:"out_float32"`
		Gate16       []float32 `json:"gate_float16"`
		Up16         []float32 `json:"up_float16"`
		Out16        []float64 `json:"out_float16"`
	} `json:"swiglu"`
}

func loadRopeReference(t *testing.T) ropeReference {
	t.Helper()
	data, err := os.ReadFile("testdata/rope_reference.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref ropeReference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

// compare checks got against want to tol relative (absolute below 1) and
// returns the largest such error.
func compare(t *testing.T, what string, got []float32, want []float64, tol float64) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	worst, bad := 0.0, 0
	for i := range got {
		d := math.Abs(float64(got[i])-want[i]) / math.Max(1, math.Abs(want[i]))
		if !(d <= tol) {
			if bad++; bad <= 5 {
				t.Errorf("%s[%d] = %g, transformers %g", what, i, got[i], want[i])
			}
		}
		worst = math.Max(worst, d)
	}
	return worst
}

// ropeTables runs Tables (or Tables3 with three rows) through refeval on
// position_ids of the given shape.
func ropeTables(t *testing.T, r RoPE, shape []int64, pos []int64) (cos, sin refeval.Tensor) {
	t.Helper()
	f := NewFunc("test", "Tables", Float32)
	in := f.Input("position_ids")
	var c, s Value
	if len(shape) == 3 {
		c, s = r.Tables3(f, in)
	} else {
		c, s = r.Tables(f, in)
	}
	f.Output("cos", c)
	f.Output("sin", s)
	out, err := refeval.Run(f.Proto(), f.Dependencies(), map[string]refeval.Tensor{"position_ids": refeval.Ints(shape, pos...)})
	if err != nil {
		t.Fatal(err)
	}
	return out["cos"], out["sin"]
}

func TestYarnMatchesTransformers(t *testing.T) {
	ref := loadRopeReference(t)
	if len(ref.Yarn) == 0 {
		t.Fatal("no yarn cases")
	}
	for _, tc := range ref.Yarn {
		t.Run(tc.Name, func(t *testing.T) {
			cfg, err := hf.Parse(tc.Config)
			if err != nil {
				t.Fatal(err)
			}
			r, err := RoPEFromConfig(cfg, tc.HeadDim)
			if err != nil {
				t.Fatal(err)
			}
			if r.Type != "yarn" {
				t.Fatalf("type %q", r.Type)
			}
			// The float32 yarn steps, from torch's base^(2i/d), bit for bit.
			pow := make([]float32, len(tc.PosFreqsBits))
			for i, b := range tc.PosFreqsBits {
				pow[i] = math.Float32frombits(uint32(b))
			}
			for i, f := range r.yarn(pow) {
				if want := uint32(tc.InvFreqBits[i]); math.Float32bits(f) != want {
					t.Errorf("yarn blend [%d] = %g (bits %d), transformers %g (bits %d)", i, f, math.Float32bits(f), math.Float32frombits(want), want)
				}
			}
			// Our base^(2i/d) is correctly rounded; torch's vectorised pow
			// (SLEEF powf, 1 ulp) sometimes is not, so inv_freq may differ
			// by an ulp there.
			inv := r.InvFreq()
			if len(inv) != len(tc.InvFreqBits) {
				t.Fatalf("%d frequencies, transformers %d", len(inv), len(tc.InvFreqBits))
			}
			exact := 0
			dInv := make([]float64, len(inv))
			for i, f := range inv {
				want := math.Float32frombits(uint32(tc.InvFreqBits[i]))
				switch ulps := int64(math.Float32bits(f)) - int64(tc.InvFreqBits[i]); {
				case ulps == 0:
					exact++
				case ulps < -1 || ulps > 1:
					t.Errorf("inv_freq[%d] = %g, transformers %g (%d ulps)", i, f, want, ulps)
				}
				dInv[i] = math.Abs(float64(f) - float64(want))
			}
			if math.Abs(r.AttentionScaling-tc.AttentionFactor) > 1e-15 {
				t.Errorf("attention scaling %.17g, transformers %.17g", r.AttentionScaling, tc.AttentionFactor)
			}
			cos, sin := ropeTables(t, r, []int64{1, int64(len(tc.Positions))}, tc.Positions)
			gotCos, gotSin := cos.F, sin.F
			if len(tc.Cos) == len(tc.Positions)*r.Dim/2 { // gpt-oss returns only one half
				gotCos, gotSin = firstHalves(t, gotCos, r.Dim), firstHalves(t, gotSin, r.Dim)
			}
			width := len(tc.Cos) / len(tc.Positions)
			// 1e-6, plus what an ulp of inv_freq moves the angle by.
			tol := func(i int) float64 {
				return 1e-6 + float64(tc.Positions[i/width])*dInv[i%width%len(dInv)]*r.AttentionScaling
			}
			worst, worstExact := 0.0, 0.0
			for _, table := range []struct {
				name string
				got  []float32
				want []float64
			}{{"cos", gotCos, tc.Cos}, {"sin", gotSin, tc.Sin}} {
				if len(table.got) != len(table.want) {
					t.Fatalf("%s: %d values, transformers %d", table.name, len(table.got), len(table.want))
				}
				for i, g := range table.got {
					d := math.Abs(float64(g) - table.want[i])
					if d > tol(i) {
						t.Errorf("%s[%d] = %g, transformers %g", table.name, i, g, table.want[i])
					}
					worst = max(worst, d)
					if dInv[i%width%len(dInv)] == 0 {
						worstExact = max(worstExact, d)
					}
				}
			}
			t.Logf("inv_freq: %d/%d bit-exact, others 1 ulp; cos/sin max error %.2g (%.2g where inv_freq is bit-exact), positions up to %d",
				exact, len(inv), worst, worstExact, tc.Positions[len(tc.Positions)-1])
		})
	}
}

// firstHalves takes the first half of each row of width dim, checking the
// second half repeats it (emb = concat(freqs, freqs)).
func firstHalves(t *testing.T, v []float32, dim int) []float32 {
	t.Helper()
	var out []float32
	for row := 0; row < len(v); row += dim {
		for j := range dim / 2 {
			if v[row+j] != v[row+dim/2+j] {
				t.Fatalf("row %d: halves differ at %d", row/dim, j)
			}
		}
		out = append(out, v[row:row+dim/2]...)
	}
	return out
}
