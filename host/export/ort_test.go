package export

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/host/weights/transform"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

func TestCheckTarget(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string // the normalised target, or an error
	}{
		{Options{}, ""}, {Options{Target: "qaic"}, ""}, {Options{Target: "ort"}, "ort"},
		{Options{Target: "trt"}, `unknown --target "trt"`},
		{Options{Target: "ort", Layerwise: true}, "cannot be combined with --layerwise"},
		{Options{Target: "ort", CCL: true}, "cannot be combined with --ccl"},
		{Options{Target: "ort", Models: []string{"vision"}}, "cannot be combined with --extra-model"},
	} {
		got, err := checkTarget(tc.opts)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) || (tc.want == "" && got != "") {
			t.Errorf("%+v: got %q, want %q", tc.opts, got, tc.want)
		}
	}
}

func TestCheckLogits(t *testing.T) {
	for _, tc := range []struct {
		logits, target string
		want           string // the value sent to the plugin, or an error
	}{
		{"", "", ""}, {"last", "", ""}, {"", "ort", ""}, {"all", "ort", "all"}, {"last", "ort", "last"},
		{"all", "", "--logits all needs --target ort"},
		{"first", "ort", `unknown --logits "first"`}, {"first", "", `unknown --logits "first"`},
	} {
		got, err := checkLogits(tc.logits, tc.target)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) || (tc.want == "" && got != "") {
			t.Errorf("--logits %q --target %q: got %q, want %q", tc.logits, tc.target, got, tc.want)
		}
	}
}

// TestLastLogitsGuard: a plan that ignored --logits last (a plugin of an
// SDK from before the option) is refused, naming the plugin.
func TestLastLogitsGuard(t *testing.T) {
	p := &plugins.Plugin{Desc: &pb.DescribeResponse{Name: "old"}}
	every := &pb.PlanResponse{ModelType: "llama", OrtDecoder: &pb.OrtDecoder{}}
	last := &pb.PlanResponse{ModelType: "llama", OrtDecoder: &pb.OrtDecoder{LastTokenLogits: true}}
	if err := lastLogitsGuard(p, every, "last"); err == nil || !strings.Contains(err.Error(), "plugin old builds llama's logits at every position") {
		t.Errorf("got %v, want a refusal naming plugin old", err)
	}
	for _, ok := range []struct {
		plan   *pb.PlanResponse
		logits string
	}{{last, "last"}, {every, ""}, {every, "all"}} {
		if err := lastLogitsGuard(p, ok.plan, ok.logits); err != nil {
			t.Errorf("--logits %q: %v", ok.logits, err)
		}
	}
}

// TestORTComputedNote: weights ONNX Runtime computes at session creation
// are noted past computedNoteBytes, stored ones never.
func TestORTComputedNote(t *testing.T) {
	cast := transform.Cast(transform.Leaf("w"), "float32")
	big := []int64{4096, 4096} // 64 MiB of float32
	for _, tc := range []struct {
		name    string
		weights []weights.Weight
		want    string
	}{
		{"stored", []weights.Weight{{Name: "a", DType: "float32", Shape: big}, {Name: "b", DType: "float32", Shape: big}}, ""},
		{"small casts", []weights.Weight{{Name: "a", DType: "float32", Shape: []int64{4096}, Transform: cast}}, ""},
		{"casts", []weights.Weight{{Name: "a", DType: "float32", Shape: big, Transform: cast}, {Name: "b", DType: "float32", Shape: big}},
			"0.1 GB of the weights (1 tensors) are transforms"},
	} {
		got := ortComputedNote(&weights.Spec{Weights: tc.weights})
		if !strings.Contains(got, tc.want) || (tc.want == "") != (got == "") {
			t.Errorf("%s: note %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestGenAIConfig(t *testing.T) {
	plan := &pb.PlanResponse{ModelType: "qwen3", VocabSize: 100, Layers: []*pb.Layer{{Index: 0}, {Index: 1}},
		OrtDecoder: &pb.OrtDecoder{NumAttentionHeads: 8, NumKeyValueHeads: 2, HeadSize: 64, HiddenSize: 512, ContextLength: 4096}}
	config := []byte(`{"eos_token_id": 7, "bos_token_id": 5}`)
	generation := []byte(`{"eos_token_id": [9, 7], "temperature": 0.6, "do_sample": true}`)
	data, err := genaiConfig(config, generation, plan)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Model struct {
			Type    string
			BOS     int   `json:"bos_token_id"`
			EOS     []int `json:"eos_token_id"`
			Pad     int   `json:"pad_token_id"`
			Context int64 `json:"context_length"`
			Decoder map[string]any
		}
		Search map[string]any
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	m := got.Model
	if m.Type != "decoder" || m.BOS != 5 || len(m.EOS) != 2 || m.EOS[0] != 9 || m.Pad != 9 || m.Context != 4096 {
		t.Errorf("model %+v: want type decoder, bos 5, eos [9 7] from generation_config.json, pad 9, context 4096", m)
	}
	if m.Decoder["num_hidden_layers"] != 2.0 || m.Decoder["head_size"] != 64.0 || m.Decoder["num_key_value_heads"] != 2.0 {
		t.Errorf("decoder %v", m.Decoder)
	}
	if got.Search["temperature"] != 0.6 || got.Search["do_sample"] != true || got.Search["past_present_share_buffer"] != true {
		t.Errorf("search %v: want generation_config.json's sampling and a shared buffer", got.Search)
	}
	if _, err := genaiConfig([]byte(`{}`), nil, plan); err == nil || !strings.Contains(err.Error(), "eos_token_id") {
		t.Errorf("no end token: got %v, want a refusal naming eos_token_id", err)
	}
	if _, err := genaiConfig(config, nil, &pb.PlanResponse{}); err == nil || !strings.Contains(err.Error(), "ort_decoder") {
		t.Errorf("no sizes: got %v, want a refusal naming ort_decoder", err)
	}
}
