// Command strata-plugin-llama is the strata plugin for Llama-family
// checkpoints (model_type llama, LlamaForCausalLM).
package main

import "github.com/strata-llm/strata/sdk"

func main() { sdk.Serve(plugin) }
