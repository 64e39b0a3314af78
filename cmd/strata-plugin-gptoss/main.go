// Command strata-plugin-gptoss serves the gptoss plugin (plugins/gptoss) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/gptoss"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(gptoss.Plugin()) }
