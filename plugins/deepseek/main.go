// Package deepseek is the strata plugin for the DeepSeek-V3 family:
// DeepSeek-V3 / V3.1 / R1 (model_type deepseek_v3), Kimi-K2 (kimi_k2, the
// same architecture) and GLM-4.7-Flash (glm4_moe_lite): multi-head latent
// attention caching compressed_kv and k_pe, grouped sigmoid-routed MoE, and
// the MTP layer as a draft model (mtp.onnx).
package deepseek

import "github.com/strata-llm/strata/sdk"

// Plugin is the deepseek plugin; cmd/strata-plugin-deepseek serves it.
func Plugin() sdk.Architecture { return plugin }
