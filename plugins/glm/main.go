// Command strata-plugin-glm is the strata plugin for GLM-4.5 / 4.6 / 4.7
// checkpoints (model_type glm4_moe, Glm4MoeForCausalLM), with their
// multi-token-prediction (MTP) layer kept out of the main graph or exported
// as a separate draft model (mtp.onnx).
package main

import "github.com/strata-llm/strata/sdk"

func main() { sdk.Serve(plugin) }
