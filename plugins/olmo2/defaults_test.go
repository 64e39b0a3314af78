package olmo2

import (
	"testing"

	"github.com/strata-llm/strata/internal/defaultstest"
)

// A config.json that omits a field gets olmo2's transformers default.
func TestConfigDefaults(t *testing.T) { defaultstest.Check(t, plugin, "olmo2") }
