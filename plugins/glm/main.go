// Package glm is the strata plugin for GLM-4.5 / 4.6 / 4.7
// checkpoints (model_type glm4_moe, Glm4MoeForCausalLM), with their
// multi-token-prediction (MTP) layer kept out of the main graph or exported
// as a separate draft model (mtp.onnx).
package glm

import "github.com/strata-llm/strata/sdk"

// Plugin is the glm plugin; cmd/strata-plugin-glm serves it.
func Plugin() sdk.Architecture { return plugin }
