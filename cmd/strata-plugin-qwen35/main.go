// Command strata-plugin-qwen35 serves the qwen35 plugin (plugins/qwen35) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/qwen35"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(qwen35.Plugin()) }
