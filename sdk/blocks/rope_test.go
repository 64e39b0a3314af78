package blocks

import (
	"math"
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
