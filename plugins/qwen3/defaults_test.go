package qwen3

import (
	"testing"

	"github.com/strata-llm/strata/internal/defaultstest"
)

// A config.json that omits a field gets qwen3's transformers default.
func TestConfigDefaults(t *testing.T) {
	defaultstest.Check(t, plugin, "qwen3")
}
