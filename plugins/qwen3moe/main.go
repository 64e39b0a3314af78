// Command strata-plugin-qwen3moe is the strata plugin for Qwen3-MoE
// checkpoints (model_type qwen3_moe, Qwen3MoeForCausalLM: the
// Qwen3-30B-A3B and Qwen3-235B-A22B family).
package main

import "github.com/strata-llm/strata/sdk"

func main() { sdk.Serve(plugin) }
