// Command strata-plugin-qwen3moe serves the qwen3moe plugin (plugins/qwen3moe) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/qwen3moe"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(qwen3moe.Plugin()) }
