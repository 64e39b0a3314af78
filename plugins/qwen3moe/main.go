// Package qwen3moe is the strata plugin for Qwen3-MoE
// checkpoints (model_type qwen3_moe, Qwen3MoeForCausalLM: the
// Qwen3-30B-A3B and Qwen3-235B-A22B family).
package qwen3moe

import "github.com/strata-llm/strata/sdk"

// Plugin is the qwen3moe plugin; cmd/strata-plugin-qwen3moe serves it.
func Plugin() sdk.Architecture { return plugin }
