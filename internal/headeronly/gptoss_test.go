//go:build unix

package headeronly

import (
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/checkpoint"
)

// TestGptOss writes the gpt-oss releases as shipped (MXFP4 experts as U8
// blocks and scales, the rest BF16, 5 GB shards): 19 tensors per layer,
// 13,761,264,768 and 65,248,815,744 bytes of tensor data (the Hub's 13.8 GB
// and 65.3 GB) in 3 and 15 shards, as the releases have.
func TestGptOss(t *testing.T) {
	cases := map[string]struct {
		layers, shards int
		bytes          int64
	}{
		"gpt-oss-20b":  {24, 3, 13_761_264_768},
		"gpt-oss-120b": {36, 15, 65_248_815_744},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := LoadRelease("../../bench/configs/" + name)
			if err != nil {
				t.Fatal(err)
			}
			tensors, err := Tensors(r.Config, "BF16")
			if err != nil {
				t.Fatal(err)
			}
			u8 := 0
			for _, ts := range tensors {
				if ts.DType == "U8" {
					u8++
					if !strings.HasSuffix(ts.Name, "_blocks") && !strings.HasSuffix(ts.Name, "_scales") {
						t.Errorf("%s is U8", ts.Name)
					}
				}
			}
			if want := 3 + 19*tc.layers; len(tensors) != want || u8 != 4*tc.layers {
				t.Errorf("%d tensors (%d U8), want %d (%d U8)", len(tensors), u8, want, 4*tc.layers)
			}
			dir := t.TempDir()
			st, err := WriteRelease(dir, r)
			if err != nil {
				t.Fatal(err)
			}
			if st.Shards != tc.shards || st.TensorBytes != tc.bytes {
				t.Errorf("Stats = %+v, want %d shards, %d tensor bytes", st, tc.shards, tc.bytes)
			}
			c, err := checkpoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			checkShardLimit(t, c, tensors, r.MaxShardBytes)
			checkSparse(t, c, st)
		})
	}
}
