package phi3

import (
	"testing"

	"github.com/strata-llm/strata/internal/defaultstest"
)

// A config.json that omits a field gets phi3's transformers default.
func TestConfigDefaults(t *testing.T) { defaultstest.Check(t, plugin, "phi3") }
