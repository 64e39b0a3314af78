// Command strata-plugin-phi3 serves the phi3 plugin (plugins/phi3) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/phi3"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(phi3.Plugin()) }
