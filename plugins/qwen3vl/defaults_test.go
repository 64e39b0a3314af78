package qwen3vl

import (
	"testing"

	"github.com/strata-llm/strata/internal/defaultstest"
)

// A config.json that omits a field gets qwen3vl's transformers default.
func TestConfigDefaults(t *testing.T) {
	defaultstest.Check(t, plugin, "qwen3_vl")
	defaultstest.Check(t, plugin, "qwen3_vl_moe")
}
