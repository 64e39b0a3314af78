package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/convert"
	"github.com/strata-llm/strata/internal/testbin"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func TestMTPDescriptionFromPlan(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		layout *pb.MTPLayout
		want   convert.MTPDescription
	}{
		"inlined": {&pb.MTPLayout{Convention: "inlined", Layers: []int32{92}, Keys: []string{"model.layers.92.eh_proj.weight"}},
			convert.MTPDescription{Convention: "inlined", Layers: []int{92}}},
		"indexed, never a bare model prefix": {&pb.MTPLayout{Convention: "indexed", Keys: []string{"mtp.fc.weight", "mtp.layers.0.q_proj.weight", "model.mtp_norm.weight"}},
			convert.MTPDescription{Convention: "indexed", Keys: []string{"mtp"}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := mtpDescription(tc.layout)
			if got.Convention != tc.want.Convention || !slices.Equal(got.Layers, tc.want.Layers) || !slices.Equal(got.Keys, tc.want.Keys) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// convert takes the MTP layout from the plugin of the model_type when there
// is one, and detects it itself otherwise: the same tensors come out whole
// either way.
func TestConvertTakesMTPFromThePlugin(t *testing.T) {
	t.Parallel()
	glmDir := t.TempDir()
	if _, err := testbin.Build(glmDir, "strata-plugin-glm", "./cmd/strata-plugin-glm"); err != nil {
		t.Fatal(err)
	}
	fixture := filepath.Join(testbin.Root(), "conformance", "fixtures", "glm-f32-mtp", "model")
	for name, plugins := range map[string]string{"with the glm plugin": glmDir, "without a plugin": t.TempDir()} {
		code, out, errOut := strata(t, "convert", fixture, "--out", filepath.Join(t.TempDir(), "out"), "--plugin-dir", plugins)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errOut)
		}
		fromPlugin := strings.Contains(errOut, "MTP layout from plugin glm: inlined, layers [2]")
		if fromPlugin != (plugins == glmDir) {
			t.Errorf("%s: stderr %q", name, errOut)
		}
		if !strings.Contains(out, "MTP (inlined): 45 tensors carried unquantised, excluded as model.layers.2") {
			t.Errorf("%s: summary %q", name, out)
		}
	}
}
