// Package qwen3vl is the strata plugin for Qwen3-VL
// checkpoints (model_type qwen3_vl, Qwen3VLForConditionalGeneration, and
// qwen3_vl_moe, Qwen3VLMoeForConditionalGeneration): the language model,
// text only, with interleaved multimodal RoPE.
package qwen3vl

import "github.com/strata-llm/strata/sdk"

// Plugin is the qwen3vl plugin; cmd/strata-plugin-qwen3vl serves it.
func Plugin() sdk.Architecture { return plugin }
