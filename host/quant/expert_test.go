package quant

import (
	"regexp"
	"testing"
)

// isRoutedExpert is the pattern (^|\.)experts\.[0-9]+\.[^.]+$, by hand.
func TestIsRoutedExpert(t *testing.T) {
	pattern := regexp.MustCompile(`(^|\.)experts\.[0-9]+\.[^.]+$`)
	for _, m := range []string{
		"model.layers.3.mlp.experts.12.gate_proj", "experts.0.up_proj", "model.layers.3.mlp.shared_experts.gate_proj",
		"model.layers.3.mlp.experts.gate_up_proj", "model.layers.3.mlp.experts.12", "model.layers.3.mlp.experts.12.",
		"model.layers.3.mlp.experts.1a.down_proj", "model.layers.3.mlp.myexperts.1.down_proj", "experts.7.x",
		"model.layers.3.mlp.experts..down_proj", "", ".", "experts", "a.experts.3.b.c", "model.layers.0.self_attn.q_proj",
	} {
		if got, want := isRoutedExpert(m), pattern.MatchString(m); got != want {
			t.Errorf("isRoutedExpert(%q) = %v, want %v", m, got, want)
		}
	}
}
