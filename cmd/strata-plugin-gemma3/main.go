// Command strata-plugin-gemma3 serves the gemma3 plugin (plugins/gemma3) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/gemma3"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(gemma3.Plugin()) }
