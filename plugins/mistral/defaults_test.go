package mistral

import (
	"testing"

	"github.com/strata-llm/strata/internal/defaultstest"
)

// A config.json that omits a field gets mistral's transformers default.
func TestConfigDefaults(t *testing.T) { defaultstest.Check(t, plugin, "mistral") }
