// Command strata-plugin-qwen3vl is the strata plugin for Qwen3-VL
// checkpoints (model_type qwen3_vl, Qwen3VLForConditionalGeneration, and
// qwen3_vl_moe, Qwen3VLMoeForConditionalGeneration): the language model,
// text only, with interleaved multimodal RoPE.
package main

import "github.com/strata-llm/strata/sdk"

func main() { sdk.Serve(plugin) }
