// Command strata-plugin-deepseek serves the deepseek plugin (plugins/deepseek) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/deepseek"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(deepseek.Plugin()) }
