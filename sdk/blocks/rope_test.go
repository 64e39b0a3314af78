package blocks

import (
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk/hf"
)

// Bit patterns of transformers' inv_freq (LlamaRotaryEmbedding, 5.24, float32)
// for head_dim 128: Llama-3.1's llama3 scaling (theta 5e5, factor 8, low 1,
// high 4, original 8192) and the default rope at theta 1e4.
var (
	transformersLlama3  = []uint32{1065353216, 1062243009, 1059709382, 1057645444, 1054963644, 1052224381, 1049992931, 1047774305, 1044812720, 1042400160, 1040434848, 1037480348, 1034871981, 1032747160, 1030233703, 1027413636, 1025116360, 1023079743, 1020030793, 1017547065, 1015523779, 1012729580, 1010044269, 1007856767, 1005516623, 1002613366, 1000248322, 998321717, 995260192, 990772486, 984863005, 979408798, 973706706, 967045384, 960179666, 952658054, 950223245, 948239807, 945335425, 942703001, 940558584, 938099311, 935253236, 932934773, 930956739, 927879669, 925373035, 923331087, 920588484, 917878407, 915670731, 913386368, 910456336, 908069481, 906125108, 903112712, 900532135, 898429952, 895853901, 893063879, 890791079, 888686786, 885670320, 883213055}
	transformersDefault = []uint32{1065353216, 1063104471, 1061157137, 1059470816, 1058010522, 1056527311, 1054337179, 1052440603, 1050798235, 1049376004, 1047712803, 1045579757, 1043732615, 1042133056, 1040747895, 1038909398, 1036831949, 1035032952, 1033475085, 1032126029, 1030116802, 1028093503, 1026341397, 1024824136, 1023510243, 1021334738, 1019364175, 1017657739, 1016180025, 1014779187, 1012562930, 1010643729, 1008981770, 1007542573, 1005959600, 1003801109, 1001931932, 1000313292, 998911607, 997151246, 995049016, 993228559, 991652109, 990286959, 988353832, 986306396, 984533390, 982998030, 981668463, 979567074, 977573004, 975846212, 974350870, 973033388, 970790693, 968848599, 967166816, 965710450, 964208661, 962024420, 960132947, 958494998, 957076594, 955395298}
)

func TestInvFreqMatchesTransformers(t *testing.T) {
	cases := map[string]struct {
		config string
		want   []uint32
	}{
		"llama3 in rope_parameters (5.x config)": {`{"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
			"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}`, transformersLlama3},
		"llama3 in rope_scaling (4.x config)": {`{"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
			"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}`, transformersLlama3},
		"legacy type key": {`{"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", "factor": 8.0,
			"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}`, transformersLlama3},
		"default rope, theta from default":  {`{}`, transformersDefault},
		"default rope, explicit null scale": {`{"rope_theta": 10000, "rope_scaling": null}`, transformersDefault},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := hf.Parse([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			r, err := RoPEFromConfig(cfg, 128)
			if err != nil {
				t.Fatal(err)
			}
			got := r.InvFreq()
			if len(got) != len(tc.want) {
				t.Fatalf("%d frequencies, want %d", len(got), len(tc.want))
			}
			for i, f := range got {
				// Bit for bit: the float32 steps mirror torch's.
				if diff := int64(math.Float32bits(f)) - int64(tc.want[i]); diff != 0 {
					t.Errorf("inv_freq[%d] = %g, transformers %g", i, f, math.Float32frombits(tc.want[i]))
				}
			}
		})
	}
}

func TestRoPEConfigErrors(t *testing.T) {
	cases := map[string]struct{ config, want string }{
		"unknown type":      {`{"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}`, `rope type "dynamic" is not supported`},
		"llama3 no factor":  {`{"rope_scaling": {"rope_type": "llama3", "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}}`, `"factor" is missing`},
		"factors reversed":  {`{"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1, "original_max_position_embeddings": 8192}}`, "high_freq_factor"},
		"scaling not a map": {`{"rope_scaling": 3}`, `"rope_scaling" must be an object`},
		"odd rotary dim":    {`{"partial_rotary_factor": 0.2890625}`, "must be even"},

		// Values transformers turns into NaN or infinite frequencies.
		"zero theta":             {`{"rope_theta": 0}`, "rope_theta must be a finite number > 0, got 0"},
		"negative theta in 5.x":  {`{"rope_parameters": {"rope_type": "default", "rope_theta": -5}}`, "rope_parameters.rope_theta must be a finite number > 0, got -5"},
		"huge theta":             {`{"rope_theta": 1e400}`, `"rope_theta" must be a number`},
		"negative partial":       {`{"partial_rotary_factor": -0.5}`, "partial_rotary_factor -0.5 must be in (0, 1]"},
		"partial above one":      {`{"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 1.5}}`, "partial_rotary_factor 1.5 must be in (0, 1]"},
		"linear zero factor":     {`{"rope_scaling": {"rope_type": "linear", "factor": 0}}`, "rope_scaling.factor must be a finite number > 0, got 0"},
		"llama3 zero omax":       {`{"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 0}}`, "rope_scaling.original_max_position_embeddings must be a finite number > 0, got 0"},
		"llama3 zero low factor": {`{"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 0, "high_freq_factor": 4, "original_max_position_embeddings": 8192}}`, "rope_scaling.low_freq_factor must be a finite number > 0, got 0"},
		"llama3 negative factor": {`{"rope_scaling": {"rope_type": "llama3", "factor": -8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}}`, "rope_scaling.factor must be a finite number > 0, got -8"},
		"yarn negative factor":   {`{"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": -2, "original_max_position_embeddings": 4096}}`, "rope_parameters.factor must be a finite number > 0, got -2"},
		"yarn zero omax":         {`{"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 0}}`, "rope_scaling.original_max_position_embeddings must be a finite number > 0, got 0"},
		"yarn zero top omax":     {`{"original_max_position_embeddings": 0, "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096}}`, "original_max_position_embeddings must be a finite number > 0, got 0"},
		"yarn no omax":           {`{"rope_scaling": {"rope_type": "yarn", "factor": 4}}`, "needs rope_scaling.original_max_position_embeddings (or max_position_embeddings)"},
		"yarn no factor":         {`{"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096}}`, "max_position_embeddings (yarn without a factor) must be a finite number > 0, got 0"},
		"yarn betas reversed":    {`{"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096, "beta_fast": 1, "beta_slow": 32}}`, "rope_scaling.beta_fast (1) must be a finite number ≥ beta_slow (32)"},
		"yarn negative beta":     {`{"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096, "beta_slow": -1}}`, "rope_scaling.beta_slow must be a finite number > 0, got -1"},
		"yarn theta one":         {`{"rope_theta": 1, "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096}}`, "rope_theta ≠ 1"},
		"yarn zero attention":    {`{"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096, "attention_factor": 0}}`, "rope_scaling.attention_factor must be a finite number > 0, got 0"},
		"yarn negative mscale":   {`{"rope_scaling": {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 1, "mscale_all_dim": -10}}`, "mscale 1 and mscale_all_dim -10 give attention factor"},
		"yarn truncate not bool": {`{"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096, "truncate": 1}}`, `"truncate" must be`},
		"mrope two sizes":        {`{"rope_scaling": {"rope_type": "default", "mrope_section": [24, 40]}}`, "must be 3 sizes [t, h, w]"},
		"mrope negative":         {`{"rope_scaling": {"rope_type": "default", "mrope_section": [-4, 34, 34]}}`, "negative entry"},
		"mrope not interleaved":  {`{"rope_scaling": {"rope_type": "default", "mrope_section": [16, 24, 24], "mrope_interleaved": false}}`, "non-interleaved MRoPE"},
		"qwen2-vl mrope":         {`{"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}`, "non-interleaved MRoPE"},

		// longrope (head_dim 128: 64 factors each).
		"longrope no short":        {`{"max_position_embeddings": 8192, "original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope", "long_factor": [2]}}`, "rope_scaling.short_factor has 0 entries; longrope needs one per rotated frequency (rotary dimension 128 / 2 = 64)"},
		"longrope short length":    {`{"max_position_embeddings": 8192, "rope_scaling": {"type": "longrope", "short_factor": [1, 1], "long_factor": [2, 2]}}`, "short_factor has 2 entries"},
		"longrope factor not list": {`{"rope_scaling": {"type": "longrope", "original_max_position_embeddings": 4096, "short_factor": 1, "long_factor": [2]}}`, `"short_factor" must be a list of numbers`},
		"longrope zero entry":      {`{"rope_scaling": {"type": "longrope", "original_max_position_embeddings": 4096, "short_factor": ` + longropeList(64, 0) + `, "long_factor": ` + longropeList(64, 1) + `}}`, "rope_scaling.short_factor[0] must be a finite number > 0, got 0"},
		"longrope no omax":         {`{"rope_scaling": {"type": "longrope", "short_factor": ` + longropeList(64, 1) + `, "long_factor": ` + longropeList(64, 1) + `}}`, "longrope rope scaling needs rope_scaling.original_max_position_embeddings (or max_position_embeddings)"},
		"longrope no factor":       {`{"rope_scaling": {"type": "longrope", "original_max_position_embeddings": 4096, "short_factor": ` + longropeList(64, 1) + `, "long_factor": ` + longropeList(64, 1) + `}}`, "max_position_embeddings (longrope without a factor) must be a finite number > 0"},
		"longrope omax one":        {`{"max_position_embeddings": 8, "original_max_position_embeddings": 1, "rope_scaling": {"type": "longrope", "short_factor": ` + longropeList(64, 1) + `, "long_factor": ` + longropeList(64, 1) + `}}`, "divides by ln(original_max_position_embeddings); 1 must be > 1"},
		"longrope with mrope":      {`{"max_position_embeddings": 8, "rope_scaling": {"type": "longrope", "mrope_section": [24, 20, 20], "short_factor": ` + longropeList(64, 1) + `, "long_factor": ` + longropeList(64, 1) + `}}`, "longrope with mrope_section"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := hf.Parse([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			_, err = RoPEFromConfig(cfg, 128)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestYarnConfigDefaults(t *testing.T) {
	cases := map[string]struct {
		config string
		want   RoPE
	}{
		"defaults, omax from max_position_embeddings (beta 0 is the default, as Python's or)": {
			`{"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "yarn", "factor": 4, "beta_fast": 0}}`,
			RoPE{Factor: 4, OriginalMaxPositions: 8192, BetaFast: 32, BetaSlow: 1, Truncate: true, AttentionScaling: 0.1*math.Log(4) + 1}},
		"top-level original_max_position_embeddings wins (Phi-3)": {
			`{"original_max_position_embeddings": 2048, "max_position_embeddings": 8192, "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096}}`,
			RoPE{Factor: 4, OriginalMaxPositions: 2048, BetaFast: 32, BetaSlow: 1, Truncate: true, AttentionScaling: 0.1*math.Log(4) + 1}},
		"implicit factor, factor below 1 keeps attention 1": {
			`{"max_position_embeddings": 2048, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "original_max_position_embeddings": 4096, "truncate": false, "beta_fast": 16, "beta_slow": 2}}`,
			RoPE{Factor: 0.5, OriginalMaxPositions: 4096, BetaFast: 16, BetaSlow: 2, AttentionScaling: 1}},
		"mscale equal to mscale_all_dim (DeepSeek-V3)": {
			`{"max_position_embeddings": 163840, "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}}`,
			RoPE{Factor: 40, OriginalMaxPositions: 4096, BetaFast: 32, BetaSlow: 1, Truncate: true, AttentionScaling: 1}},
		"equal betas (Kimi-K2: transformers widens the zero-width ramp by 0.001)": {
			`{"max_position_embeddings": 131072, "rope_scaling": {"type": "yarn", "factor": 32, "beta_fast": 1, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}}`,
			RoPE{Factor: 32, OriginalMaxPositions: 4096, BetaFast: 1, BetaSlow: 1, Truncate: true, AttentionScaling: 1}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := hf.Parse([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			r, err := RoPEFromConfig(cfg, 64)
			if err != nil {
				t.Fatal(err)
			}
			got := RoPE{Factor: r.Factor, OriginalMaxPositions: r.OriginalMaxPositions, BetaFast: r.BetaFast, BetaSlow: r.BetaSlow,
				Truncate: r.Truncate, AttentionScaling: r.AttentionScaling}
			if r.Type != "yarn" || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %s %+v, want yarn %+v", r.Type, got, tc.want)
			}
		})
	}
}

// longropeList is a JSON list of n copies of v.
func longropeList(n int, v float64) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// The interleaved MRoPE rows are transformers' Qwen3-VL recomposition:
// frequency j turns with H where j ≡ 1 (mod 3) and j < 3h, with W where
// j ≡ 2 and j < 3w, else with T; sections need not fit the rotary width.
func TestMRoPERowsClipAsTransformers(t *testing.T) {
	for _, tc := range []struct {
		section []int
		half    int
		want    []int64
	}{
		{[]int{24, 20, 20}, 8, []int64{0, 1, 2, 0, 1, 2, 0, 1}}, // the default, past 8 frequencies
		{[]int{1, 3, 3}, 8, []int64{0, 1, 2, 0, 1, 2, 0, 1}},
		{[]int{4, 2, 2}, 8, []int64{0, 1, 2, 0, 1, 2, 0, 0}},
		{[]int{6, 1, 1}, 8, []int64{0, 1, 2, 0, 0, 0, 0, 0}},
		{[]int{8, 0, 0}, 8, []int64{0, 0, 0, 0, 0, 0, 0, 0}},
	} {
		var r RoPE
		if err := r.SetMRoPE(tc.section); err != nil {
			t.Fatal(err)
		}
		for j := range tc.half {
			if got := r.mropeRow(j); got != tc.want[j] {
				t.Errorf("section %v: frequency %d turns with row %d, want %d", tc.section, j, got, tc.want[j])
			}
		}
	}
}
