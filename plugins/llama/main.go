// Package llama is the strata plugin for Llama-family
// checkpoints (model_type llama, LlamaForCausalLM).
package llama

import "github.com/strata-llm/strata/sdk"

// Plugin is the llama plugin; cmd/strata-plugin-llama serves it.
func Plugin() sdk.Architecture { return plugin }
