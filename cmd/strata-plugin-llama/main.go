// Command strata-plugin-llama serves the llama plugin (plugins/llama) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/llama"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(llama.Plugin()) }
