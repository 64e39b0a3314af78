// Command strata-plugin-mistral serves the mistral plugin (plugins/mistral) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/mistral"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(mistral.Plugin()) }
