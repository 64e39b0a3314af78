package qwen3moe

import (
	"testing"

	"github.com/strata-llm/strata/internal/defaultstest"
)

// A config.json that omits a field gets qwen3moe's transformers default.
func TestConfigDefaults(t *testing.T) {
	defaultstest.Check(t, plugin, "qwen3_moe")
}
