// Command strata-plugin-qwen3vl serves the qwen3vl plugin (plugins/qwen3vl) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/qwen3vl"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(qwen3vl.Plugin()) }
