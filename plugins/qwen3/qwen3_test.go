package qwen3

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/plugintest"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// The walk-through in docs/plugins.md is this plugin, verbatim.
func TestDocsShowThisPlugin(t *testing.T) {
	doc, err := os.ReadFile("../../docs/plugins.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("qwen3.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- begin plugins/qwen3/qwen3.go -->\n```go\n")
	shown, _, ok2 := strings.Cut(rest, "```\n<!-- end plugins/qwen3/qwen3.go -->")
	if !ok || !ok2 {
		t.Fatal("docs/plugins.md lost the markers around the plugin's code")
	}
	if shown != string(src) {
		t.Error("docs/plugins.md shows other code than plugins/qwen3/qwen3.go: copy the file into the doc")
	}
	code := 0
	for _, line := range strings.Split(string(src), "\n") {
		if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "//") {
			code++
		}
	}
	if code > 60 {
		t.Errorf("the walk-through has %d lines of code; it should show an architecture in at most 60", code)
	}
}

const tinyConfig = `{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
	"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 128, "attention_bias": true}`

func TestBuildBindsEveryWeight(t *testing.T) {
	model := plugintest.Edited(t, plugin, tinyConfig, nil, "F32")
	parts := plugintest.RequireBound(t, plugin, model,
		&pb.BuildRequest{Part: sdk.PartEmbed}, &pb.BuildRequest{Part: sdk.PartContext},
		&pb.BuildRequest{Part: sdk.PartLayer, Kind: "decoder", Layers: []int32{0, 1}},
		&pb.BuildRequest{Part: sdk.PartFinal})
	if got := parts[2][1]["self_attn.k_norm.weight"]; len(got) != 1 || got[0] != "model.layers.1.self_attn.k_norm.weight" {
		t.Errorf("layer 1 k_norm bound to %v", got)
	}
	if got := parts[2][0]["self_attn.o_proj.bias"]; len(got) != 1 {
		t.Errorf("o_proj.bias bound to %v, want the bias (attention_bias)", got)
	}
}

func TestRefusals(t *testing.T) {
	cases := map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"sliding window":   {func(m map[string]any) { m["use_sliding_window"] = true }, "full attention only"},
		"gelu":             {func(m map[string]any) { m["hidden_act"] = "gelu" }, `hidden_act "gelu" is not supported by the qwen3 plugin`},
		"negative theta":   {func(m map[string]any) { m["rope_theta"] = -1 }, "rope_theta"},
		"zero vocab":       {func(m map[string]any) { m["vocab_size"] = 0 }, "vocab_size must be positive"},
		"huge layer count": {func(m map[string]any) { m["num_hidden_layers"] = 1000000000 }, "holds tensors for 2 layers"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			// Tensors of the unedited config: what the checkpoint holds.
			model := plugintest.Edited(t, plugin, tinyConfig, nil, "F32")
			model.ConfigJson = plugintest.Config(t, tinyConfig, tc.edit)
			resp, err := plugin.Check(context.Background(), &pb.CheckRequest{Model: model})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetSupported() || !strings.Contains(strings.Join(resp.GetReasons(), ";"), tc.want) {
				t.Errorf("supported=%v reasons=%v, want %q", resp.GetSupported(), resp.GetReasons(), tc.want)
			}
		})
	}
}
