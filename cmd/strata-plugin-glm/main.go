// Command strata-plugin-glm serves the glm plugin (plugins/glm) to strata.
package main

import (
	"github.com/strata-llm/strata/plugins/glm"
	"github.com/strata-llm/strata/sdk"
)

func main() { sdk.Serve(glm.Plugin()) }
