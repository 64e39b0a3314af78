package export

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/strata-llm/strata/host/checkpoint"
	"github.com/strata-llm/strata/host/plugins"
	"github.com/strata-llm/strata/host/weights"
	"github.com/strata-llm/strata/internal/usage"
	"github.com/strata-llm/strata/sdk"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// --target ort: the graph in ONNX Runtime's form (the plugin builds it;
// the IO is onnxruntime-genai's "decoder", window.ModelIO), beside it
// genai_config.json and the checkpoint's tokenizer files, so that
// onnxruntime_genai.Model(DIR) runs the export.

// Export targets (--target).
const (
	TargetQAIC = "qaic"        // the default: QEfficient's IO and ops
	TargetORT  = sdk.TargetORT // ONNX Runtime's contrib ops, genai's IO
)

// GenAIConfigFile is onnxruntime-genai's configuration, written with --target ort.
const GenAIConfigFile = "genai_config.json"

// tokenizerFiles are copied from the checkpoint with --target ort, when
// present: what onnxruntime-genai's Tokenizer and search defaults read.
var tokenizerFiles = []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}

// checkTarget normalises --target ("" for the default) and refuses the
// options the ORT form has no place for.
func checkTarget(opts Options) (string, error) {
	switch opts.Target {
	case "", TargetQAIC:
		return "", nil
	case TargetORT:
	default:
		return "", usage.Errorf("unknown --target %q: use %s (the default) or %s", opts.Target, TargetQAIC, TargetORT)
	}
	for _, c := range []struct {
		set  bool
		flag string
	}{
		{opts.Layerwise, "--layerwise"}, {opts.ContinuousBatching, "--continuous-batching"}, {opts.CCL, "--ccl"},
		{len(opts.Models) > 0, "--extra-model"}, {opts.WeightSpec != "", "--weight-spec"},
	} {
		if c.set {
			return "", usage.Errorf("--target ort cannot be combined with %s: onnxruntime-genai runs one whole model with its own KV-cache IO; drop %s, or export the default target", c.flag, c.flag)
		}
	}
	return TargetORT, nil
}

// checkLogits normalises --logits for target (as checkTarget returns it):
// the value the plugin is sent, "" for the target's own form.
func checkLogits(logits, target string) (string, error) {
	switch {
	case logits != "" && logits != sdk.LogitsAll && logits != sdk.LogitsLast:
		return "", usage.Errorf("unknown --logits %q: use %s (every position) or %s (each row's last valid token)", logits, sdk.LogitsAll, sdk.LogitsLast)
	case target == TargetORT:
		return logits, nil
	case logits == sdk.LogitsAll:
		return "", usage.Errorf("--logits %s needs --target %s: the %s form outputs each row's last valid token's logits only; drop --logits, or export with --target %s",
			sdk.LogitsAll, TargetORT, TargetQAIC, TargetORT)
	}
	return "", nil // the QAIC form's logits are the last token's
}

// lastLogitsGuard refuses a plan that ignored --logits last: a plugin built
// with an SDK from before the option outputs every position.
func lastLogitsGuard(p *plugins.Plugin, plan *pb.PlanResponse, logits string) error {
	if logits == sdk.LogitsLast && !plan.GetOrtDecoder().GetLastTokenLogits() {
		return fmt.Errorf("--logits %s: plugin %s builds %s's logits at every position only (an SDK from before the option); drop --logits %s, or rebuild the plugin with the current SDK",
			sdk.LogitsLast, p.Desc.GetName(), plan.GetModelType(), sdk.LogitsLast)
	}
	return nil
}

// computedNoteBytes is how many bytes of weights computed at session
// creation make ortComputedNote worth saying (a few cast norms are not).
const computedNoteBytes = 64 << 20

// ortComputedNote says, for --target ort with weights referenced, how much
// of the weights ONNX Runtime computes from the checkpoint's tensors at
// every session creation (constant folding: casts of bf16 weights, Qwen3-
// MoE's experts interleaved for its MoE op), and that --weights materialize
// writes them once: "" when that is little. A random Qwen3-MoE of 64
// experts (2.7 GB): sessions open in 6–8 s at 6.5 GB referenced, 0.25 s at
// 2.7 GB materialised.
func ortComputedNote(spec *weights.Spec) string {
	var n int
	var bytes int64
	for i := range spec.Weights {
		if w := &spec.Weights[i]; w.Computed() {
			n++
			bytes += w.Bytes()
		}
	}
	if bytes < computedNoteBytes {
		return ""
	}
	return fmt.Sprintf("--target ort: %.1f GB of the weights (%d tensors) are transforms of the checkpoint's (casts, experts stacked or interleaved) that ONNX Runtime computes at every session creation; --weights materialize writes them once, and sessions then map them",
		float64(bytes)/1e9, n)
}

// targetGuard refuses a target the plugin does not declare for the
// architecture (Capabilities.targets).
func targetGuard(p *plugins.Plugin, modelType, target string) error {
	if target == "" {
		return nil
	}
	support, _ := p.Support(modelType)
	declared := support.GetCapabilities().GetTargets()
	if slices.Contains(declared, target) {
		return nil
	}
	return fmt.Errorf("--target %s: plugin %s does not build that form of %s (its targets: %s); export without --target %s, or install a plugin that declares it",
		target, p.Desc.GetName(), modelType, listOrNone(declared), target)
}

// ortFiles are genai_config.json and the checkpoint's tokenizer files, by
// the name to write them under (regular files, never links).
func ortFiles(ckpt *checkpoint.Checkpoint, plan *pb.PlanResponse) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, name := range tokenizerFiles {
		data, err := readRegular(filepath.Join(ckpt.Dir, name))
		if err != nil {
			return nil, err
		}
		if data != nil {
			files[name] = data
		}
	}
	config, err := genaiConfig(ckpt.ConfigJSON, files["generation_config.json"], plan)
	if err != nil {
		return nil, err
	}
	files[GenAIConfigFile] = config
	return files, nil
}

// ORTFiles are the files --target ort writes beside model.onnx, those
// present in the checkpoint of the tokenizer files.
func ORTFiles() []string { return append([]string{GenAIConfigFile}, tokenizerFiles...) }

// pruneORTFiles removes the files of an earlier --target ort export into
// the directory that this export does not write: a genai_config.json left
// beside a model of the default form would describe IO it does not have.
func (o outDir) pruneORTFiles(written map[string][]byte) error {
	for _, name := range ORTFiles() {
		if _, ok := written[name]; !ok && o.Owned(name) {
			if err := o.Remove(name); err != nil {
				return fmt.Errorf("removing %s of an earlier --target ort export: %w", o.path(name), err)
			}
		}
	}
	return nil
}

// maxTokenizerFile bounds a tokenizer file read into memory.
const maxTokenizerFile = 1 << 30

// readRegular reads path, nil when absent; a path that is not a regular
// file (after links, as the Hugging Face cache holds them) is refused.
func readRegular(path string) ([]byte, error) {
	st, err := os.Stat(path)
	switch {
	case os.IsNotExist(err):
		return nil, nil
	case err != nil:
		return nil, err
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("%s is not a regular file (%s); --target ort copies the tokenizer files: replace it with the file itself", path, st.Mode().Type())
	case st.Size() > maxTokenizerFile:
		return nil, fmt.Errorf("%s is %d bytes, more than a tokenizer file holds; remove it from the checkpoint directory", path, st.Size())
	}
	return os.ReadFile(path)
}

// genaiConfig is genai_config.json for the plan's ORT form: the decoder's
// sizes and IO names, the special tokens (generation_config.json first,
// then config.json, as transformers' generate reads them) and search
// defaults.
func genaiConfig(configJSON, generationJSON []byte, plan *pb.PlanResponse) ([]byte, error) {
	d := plan.GetOrtDecoder()
	if d == nil || d.GetNumAttentionHeads() <= 0 || d.GetHeadSize() <= 0 {
		return nil, fmt.Errorf("--target ort: the plugin's plan does not describe the decoder's sizes (ort_decoder); it cannot be run by onnxruntime-genai")
	}
	var config, generation map[string]any
	if err := json.Unmarshal(configJSON, &config); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	if generationJSON != nil {
		if err := json.Unmarshal(generationJSON, &generation); err != nil {
			return nil, fmt.Errorf("generation_config.json: %w; fix or remove it", err)
		}
	}
	token := func(name string) any {
		for _, src := range []map[string]any{generation, config} {
			if v, ok := src[name]; ok && v != nil {
				return v
			}
		}
		return nil
	}
	eos := token("eos_token_id")
	if eos == nil {
		return nil, fmt.Errorf("--target ort: neither generation_config.json nor config.json names eos_token_id, which onnxruntime-genai needs to stop; add it to config.json")
	}
	bos, pad := token("bos_token_id"), token("pad_token_id")
	if bos == nil {
		bos = 1 // as onnxruntime-genai's builder
	}
	if pad == nil { // the first end token, as genai's builder
		if ids, ok := eos.([]any); ok && len(ids) > 0 {
			pad = ids[0]
		} else {
			pad = eos
		}
	}
	search := map[string]any{"do_sample": false, "early_stopping": true, "length_penalty": 1.0, "max_length": d.GetContextLength(),
		"min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1, "past_present_share_buffer": true,
		"repetition_penalty": 1.0, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "diversity_penalty": 0.0}
	for _, k := range []string{"do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "num_beams"} {
		if v, ok := generation[k]; ok && v != nil {
			search[k] = v
		}
	}
	layers := len(plan.GetLayers())
	cfg := map[string]any{
		"model": map[string]any{
			"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
			"context_length": d.GetContextLength(),
			// onnxruntime-genai's generic decoder-only model: the graph is
			// all it runs, and genai knows only a fixed list of model_types
			// (not olmo2 or qwen3_moe, say).
			"type":       "decoder",
			"vocab_size": plan.GetVocabSize(),
			"decoder": map[string]any{
				"session_options": map[string]any{"log_id": "onnxruntime-genai", "provider_options": []any{}},
				"filename":        ModelFile,
				"head_size":       d.GetHeadSize(), "hidden_size": d.GetHiddenSize(),
				"num_attention_heads": d.GetNumAttentionHeads(), "num_key_value_heads": d.GetNumKeyValueHeads(),
				"num_hidden_layers": layers,
				"inputs": map[string]any{"input_ids": sdk.InputIDs, "attention_mask": sdk.AttentionMask,
					"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
				"outputs": map[string]any{"logits": sdk.Logits,
					"present_key_names": "present.%d.key", "present_value_names": "present.%d.value"},
			},
		},
		"search": search,
	}
	return json.MarshalIndent(cfg, "", "  ")
}
