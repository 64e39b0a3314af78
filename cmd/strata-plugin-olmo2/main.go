// Command strata-plugin-olmo2 serves the olmo2 plugin (plugins/olmo2) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/olmo2"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(olmo2.Plugin()) }
