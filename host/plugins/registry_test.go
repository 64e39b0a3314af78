package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/strata-llm/strata/internal/testbin"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// A request and a response far above gRPC's 4 MiB default cross both ways:
// the limits are raised on the host and in the plugin.
func TestMessagesBeyondFourMiB(t *testing.T) {
	dir := t.TempDir()
	if _, err := testbin.Build(dir, "strata-plugin-llama", "./cmd/strata-plugin-llama"); err != nil {
		t.Fatal(err)
	}
	reg := Load(context.Background(), []SearchDir{{dir, "test"}}, Options{Timeout: time.Minute})
	defer reg.Close()
	p, err := reg.For("llama")
	if err != nil {
		t.Fatal(err)
	}
	const layers = 20000
	cfg, _ := json.Marshal(map[string]any{"model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
		"num_hidden_layers": layers, "num_attention_heads": 1, "vocab_size": 8})
	model := &pb.Model{ConfigJson: cfg}
	add := func(key string, shape ...int64) {
		model.Tensors = append(model.Tensors, &pb.TensorInfo{Key: key, Dtype: "BF16", Shape: shape})
	}
	add("model.embed_tokens.weight", 8, 8)
	add("model.norm.weight", 8)
	add("lm_head.weight", 8, 8)
	for l := range layers {
		for _, w := range []string{"input_layernorm", "post_attention_layernorm"} {
			add(fmt.Sprintf("model.layers.%d.%s.weight", l, w), 8)
		}
		for _, w := range []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"} {
			add(fmt.Sprintf("model.layers.%d.%s.weight", l, w), 8, 8)
		}
	}
	all := make([]int32, layers)
	for i := range all {
		all[i] = int32(i)
	}
	req := &pb.BuildRequest{Model: model, Part: "layer", Kind: "decoder", Layers: all}
	if size := proto.Size(req); size < 8<<20 {
		t.Fatalf("request only %d bytes; the test needs more than 4 MiB", size)
	}
	resp, err := p.Build(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if size := proto.Size(resp); size < 4<<20 || len(resp.GetWeights()) != layers {
		t.Errorf("response %d bytes with %d layers; want > 4 MiB and %d", size, len(resp.GetWeights()), layers)
	}
}
