// Command strata-plugin-qwen3 serves the qwen3 plugin (plugins/qwen3) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/qwen3"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(qwen3.Plugin()) }
