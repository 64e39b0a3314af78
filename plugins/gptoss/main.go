// Package gptoss is the strata plugin for gpt-oss checkpoints
// (model_type gpt_oss, GptOssForCausalLM: gpt-oss-20b and gpt-oss-120b).
package gptoss

import "github.com/strata-llm/strata/sdk"

// Plugin is the gptoss plugin; cmd/strata-plugin-gptoss serves it.
func Plugin() sdk.Architecture { return plugin }
