package blocks

import (
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/fn"
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
	LongRoPE []struct {
		Name            string          `json:"name"`
		Config          json.RawMessage `json:"config"`
		HeadDim         int             `json:"head_dim"`
		PosFreqsBits    []int32         `json:"pos_freqs_bits"`
		AttentionFactor float64         `json:"attention_factor"`
		Short, Long     longropeCall
	} `json:"longrope"`
	MRoPE struct {
		Config      json.RawMessage `json:"config"`
		HeadDim     int             `json:"head_dim"`
		InvFreqBits []int32         `json:"inv_freq_bits"`
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

// longropeCall is one forward call of transformers' Phi3RotaryEmbedding:
// the positions, the table it turned by, and its cos/sin.
type longropeCall struct {
	Positions   []int64 `json:"positions"`
	InvFreqBits []int32 `json:"inv_freq_bits"`
	Cos, Sin    []float64
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
	f := fn.NewFunc("test", "Tables", fn.Float32)
	in := f.Input("position_ids")
	var c, s fn.Value
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

// ropeFromReference is the RoPE strata reads from a reference case's config.
func ropeFromReference(t *testing.T, config json.RawMessage, headDim int) RoPE {
	t.Helper()
	cfg, err := hf.Parse(config)
	if err != nil {
		t.Fatal(err)
	}
	r, err := RoPEFromConfig(cfg, headDim)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestYarnMatchesTransformers(t *testing.T) {
	ref := loadRopeReference(t)
	if len(ref.Yarn) == 0 {
		t.Fatal("no yarn cases")
	}
	for _, tc := range ref.Yarn {
		t.Run(tc.Name, func(t *testing.T) {
			r := ropeFromReference(t, tc.Config, tc.HeadDim)
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
				j := i % width % len(dInv)
				return angleTolerance(float64(tc.Positions[i/width]), inv[j], dInv[j], r.AttentionScaling)
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

// angleTolerance bounds how far cos or sin may move when inv_freq is off
// by dInv at position p: the exact angles differ by p·dInv, and each is
// rounded to float32 (half an ulp each), times the attention scaling.
func angleTolerance(p float64, inv float32, dInv, scaling float64) float64 {
	if dInv == 0 {
		return 1e-6
	}
	a := float32(p) * inv
	return 1e-6 + (p*dInv+float64(math.Nextafter32(a, float32(math.Inf(1)))-a))*scaling
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

func TestMRoPEMatchesTransformers(t *testing.T) {
	ref := loadRopeReference(t).MRoPE
	cfg, err := hf.Parse(ref.Config)
	if err != nil {
		t.Fatal(err)
	}
	r, err := RoPEFromConfig(cfg, ref.HeadDim)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.MRoPESection) != 3 || r.MRoPESection[0] != 24 || r.MRoPESection[1] != 20 || r.MRoPESection[2] != 20 {
		t.Fatalf("mrope section %v, want [24 20 20]", r.MRoPESection)
	}
	rows := ref.PositionIDs
	S := len(rows[0][0])
	var pos []int64
	for _, row := range rows {
		pos = append(pos, row[0]...)
	}
	cos, sin := ropeTables(t, r, []int64{3, 1, int64(S)}, pos)
	if want := []int64{1, 1, int64(S), int64(r.Dim)}; !slices.Equal(cos.Shape, want) {
		t.Fatalf("cos shape %v, want %v", cos.Shape, want)
	}
	// As for yarn: an ulp of difference in inv_freq (torch's pow) moves
	// the angle by position × ulp.
	inv := r.InvFreq()
	exact := 0
	for i, f := range inv {
		d := math.Abs(float64(f) - float64(math.Float32frombits(uint32(ref.InvFreqBits[i]))))
		if d == 0 {
			exact++
		} else if d > 2*float64(math.Nextafter32(f, 2)-f) {
			t.Errorf("inv_freq[%d] = %g, transformers %g", i, f, math.Float32frombits(uint32(ref.InvFreqBits[i])))
		}
	}
	half := r.Dim / 2
	worst, worstExact := 0.0, 0.0
	for _, table := range []struct {
		name string
		got  []float32
		want []float64
	}{{"cos", cos.F, ref.Cos}, {"sin", sin.F, ref.Sin}} {
		for i, g := range table.got {
			s, j := i/r.Dim, i%r.Dim%half
			p := float64(rows[r.mropeRow(j)][0][s])
			dInv := math.Abs(float64(inv[j]) - float64(math.Float32frombits(uint32(ref.InvFreqBits[j]))))
			d := math.Abs(float64(g) - table.want[i])
			if d > angleTolerance(p, inv[j], dInv, 1) {
				t.Errorf("%s[s=%d, j=%d] = %g, transformers %g", table.name, s, i%r.Dim, g, table.want[i])
			}
			worst = max(worst, d)
			if dInv == 0 {
				worstExact = max(worstExact, d)
			}
		}
	}
	t.Logf("inv_freq %d/%d bit-exact; cos/sin max error %.2g (%.2g where inv_freq is bit-exact)", exact, len(inv), worst, worstExact)
}

// Text only, the three rows are equal and Tables3 is Tables.
func TestMRoPETextOnlyIsPlainRoPE(t *testing.T) {
	r := RoPE{Type: "default", Base: 5e6, Dim: 128, MRoPESection: []int{24, 20, 20}, AttentionScaling: 1}
	pos := []int64{0, 1, 2, 3, 4, 5, 6, 7, 1000, 9, -1, 262143}
	cos, sin := ropeTables(t, r, []int64{2, 6}, pos)
	cos3, sin3 := ropeTables(t, r, []int64{3, 2, 6}, slices.Concat(pos, pos, pos))
	if !slices.Equal(cos.Shape, cos3.Shape) || !slices.Equal(cos.F, cos3.F) || !slices.Equal(sin.F, sin3.F) {
		t.Error("Tables3 on equal rows differs from Tables")
	}
}

func TestMRoPERowsInterleave(t *testing.T) {
	r := RoPE{Dim: 128, MRoPESection: []int{24, 20, 20}}
	var got []byte
	for j := range r.Dim / 2 {
		got = append(got, "THW"[r.mropeRow(j)])
	}
	if want := strings.Repeat("THW", 20) + "TTTT"; string(got) != want {
		t.Errorf("rows %s, want %s", got, want)
	}
}

// longrope's two tables, from transformers' own base^(2i/d) bit for bit and
// from ours to an ulp, its attention factor, and Tables switching between
// them per call on max(position_ids) + 1 as transformers does.
func TestLongRoPEMatchesTransformers(t *testing.T) {
	ref := loadRopeReference(t)
	if len(ref.LongRoPE) == 0 {
		t.Fatal("no longrope cases")
	}
	for _, tc := range ref.LongRoPE {
		t.Run(tc.Name, func(t *testing.T) {
			r := ropeFromReference(t, tc.Config, tc.HeadDim)
			if r.Type != "longrope" || r.OriginalMaxPositions != 4096 {
				t.Fatalf("type %q, original max %g", r.Type, r.OriginalMaxPositions)
			}
			if r.AttentionScaling != tc.AttentionFactor {
				t.Errorf("attention scaling %.17g, transformers %.17g", r.AttentionScaling, tc.AttentionFactor)
			}
			pow := make([]float32, len(tc.PosFreqsBits))
			for i, b := range tc.PosFreqsBits {
				pow[i] = math.Float32frombits(uint32(b))
			}
			for _, call := range []struct {
				name    string
				factors []float64
				inv     []float32
				ref     longropeCall
			}{{"short", r.ShortFactor, r.InvFreq(), tc.Short}, {"long", r.LongFactor, r.LongInvFreq(), tc.Long}} {
				for i, f := range longrope(pow, call.factors) {
					if want := uint32(call.ref.InvFreqBits[i]); math.Float32bits(f) != want {
						t.Errorf("%s: 1/(factor·pow) [%d] = %g, transformers %g", call.name, i, f, math.Float32frombits(want))
					}
				}
				if len(call.inv) != len(call.ref.InvFreqBits) {
					t.Fatalf("%s: %d frequencies, transformers %d", call.name, len(call.inv), len(call.ref.InvFreqBits))
				}
				// An ulp of base^(2i/d) (torch's pow, as for yarn) may move
				// 1/(factor·pow) by two after the product's rounding.
				dInv := make([]float64, len(call.inv))
				for i, f := range call.inv {
					if ulps := int64(math.Float32bits(f)) - int64(call.ref.InvFreqBits[i]); ulps < -2 || ulps > 2 {
						t.Errorf("%s: inv_freq[%d] = %g, %d ulps from transformers", call.name, i, f, ulps)
					}
					dInv[i] = math.Abs(float64(f) - float64(math.Float32frombits(uint32(call.ref.InvFreqBits[i]))))
				}
				pos := call.ref.Positions
				cos, sin := ropeTables(t, r, []int64{1, int64(len(pos))}, pos)
				width := r.Dim
				worst := 0.0
				for _, table := range []struct {
					got  []float32
					want []float64
				}{{cos.F, call.ref.Cos}, {sin.F, call.ref.Sin}} {
					if len(table.got) != len(table.want) {
						t.Fatalf("%s: %d values, transformers %d", call.name, len(table.got), len(table.want))
					}
					for i, g := range table.got {
						j := i % width % len(dInv)
						d := math.Abs(float64(g) - table.want[i])
						if d > angleTolerance(float64(pos[i/width]), call.inv[j], dInv[j], r.AttentionScaling) {
							t.Errorf("%s: table[%d] = %g, transformers %g", call.name, i, g, table.want[i])
						}
						worst = max(worst, d)
					}
				}
				t.Logf("%s (max position %d): cos/sin max error %.2g", call.name, pos[len(pos)-1], worst)
			}
		})
	}
}
