package blocks_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/hf"
)

// stretchedParams is the plugin kind's own parameters (RoPE.Params).
type stretchedParams struct{ stretch float64 }

// A kind as a third-party plugin registers it, outside the SDK: the
// default frequencies divided by stretch, cos and sin scaled by gain.
func init() {
	blocks.RegisterRoPEKind(blocks.RoPEKind{Name: "test_stretched",
		Read: func(r *blocks.RoPE, p blocks.RoPEParams) error {
			stretch, err := p.Float("stretch")
			if err != nil {
				return err
			}
			if !(stretch > 0) {
				return fmt.Errorf("config.json: %s.stretch must be > 0, got %g", p.Name, stretch)
			}
			r.Params = stretchedParams{stretch}
			r.AttentionScaling, err = p.FloatOr("gain", 1)
			return err
		},
		InvFreq: func(r blocks.RoPE, pow []float32) []float32 {
			stretch := float32(r.Params.(stretchedParams).stretch)
			inv := make([]float32, len(pow))
			for i, p := range pow {
				inv[i] = 1 / (stretch * p)
			}
			return inv
		}})
}

func ropeFrom(t *testing.T, config string, headDim int) (blocks.RoPE, error) {
	t.Helper()
	c, err := hf.Parse([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	return blocks.RoPEFromConfig(c, headDim)
}

// A plugin-registered kind is read from either place config.json keeps
// the rope settings and makes the frequencies and the scaling.
func TestRegisteredRoPEKind(t *testing.T) {
	if !slices.Contains(blocks.RoPEKinds(), "test_stretched") {
		t.Fatalf("RoPEKinds() = %v, want it to list test_stretched", blocks.RoPEKinds())
	}
	for _, config := range []string{
		`{"rope_theta": 100, "rope_scaling": {"rope_type": "test_stretched", "stretch": 4, "gain": 0.5}}`,
		`{"rope_parameters": {"rope_type": "test_stretched", "rope_theta": 100, "stretch": 4, "gain": 0.5}}`,
	} {
		r, err := ropeFrom(t, config, 8)
		if err != nil {
			t.Fatal(err)
		}
		def, err := ropeFrom(t, `{"rope_theta": 100}`, 8)
		if err != nil {
			t.Fatal(err)
		}
		got, base := r.InvFreq(), def.InvFreq()
		for i := range base {
			if want := 1 / (4 * (1 / base[i])); got[i] != want {
				t.Errorf("%s: inv_freq[%d] = %g, want %g", config, i, got[i], want)
			}
		}
		if r.Type != "test_stretched" || r.AttentionScaling != 0.5 || r.LongInvFreq() != nil {
			t.Errorf("%s: type %q, scaling %g, long table %v; want test_stretched, 0.5, none", config, r.Type, r.AttentionScaling, r.LongInvFreq())
		}
		f := fn.NewFunc("test", "Tables", fn.Float32)
		ids := f.Input("position_ids")
		cos, sin := r.Tables(f, ids)
		if cos == "" || sin == "" {
			t.Fatal("Tables returned no values")
		}
	}
	if _, err := ropeFrom(t, `{"rope_scaling": {"rope_type": "test_stretched", "stretch": -1}}`, 8); err == nil ||
		!strings.Contains(err.Error(), "rope_scaling.stretch must be > 0, got -1") {
		t.Errorf("error %v, want the kind's own refusal", err)
	}
}

// An unknown kind is refused by name, with the kinds there are.
func TestUnknownRoPEKind(t *testing.T) {
	_, err := ropeFrom(t, `{"rope_parameters": {"rope_type": "dynamic", "factor": 2}}`, 8)
	want := `config.json: rope_parameters: rope type "dynamic" is not supported (supported: default, linear, llama3, longrope, mrope, test_stretched, yarn)`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want %q", err, want)
	}
}

func TestRegisterRoPEKindTwice(t *testing.T) {
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), `RoPE kind "yarn" is already registered`) {
			t.Errorf("panic %v, want one naming yarn", p)
		}
	}()
	blocks.RegisterRoPEKind(blocks.RoPEKind{Name: "yarn"})
}
