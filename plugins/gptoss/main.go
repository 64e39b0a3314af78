// Command strata-plugin-gptoss is the strata plugin for gpt-oss checkpoints
// (model_type gpt_oss, GptOssForCausalLM: gpt-oss-20b and gpt-oss-120b).
package main

import "github.com/strata-llm/strata/sdk"

func main() { sdk.Serve(plugin) }
