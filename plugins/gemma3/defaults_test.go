package gemma3

import (
	"testing"

	"github.com/strata-llm/strata/internal/defaultstest"
)

// A config.json that omits a field gets gemma3_text's transformers default.
func TestConfigDefaults(t *testing.T) { defaultstest.Check(t, plugin, "gemma3_text") }
