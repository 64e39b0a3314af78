package blocks

import (
	"fmt"
	"math"

	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/hf"
)

// ClampedSwiGLU is gpt-oss's expert activation, as transformers'
// GptOssExperts._apply_gate computes it in the activation dtype:
//
//	gate = min(gate, Limit)
//	up   = clamp(up, -Limit, Limit)
//	out  = (up + 1) · gate · sigmoid(gate · Alpha)
//
// Use its Activation method as Experts.Activation.
type ClampedSwiGLU struct {
	Alpha float64 // swiglu_alpha, 1.702
	Limit float64 // swiglu_limit, 7.0
}

// ClampedSwiGLUFromConfig reads swiglu_alpha (default 1.702) and
// swiglu_limit (default 7.0) from a gpt-oss config.
func ClampedSwiGLUFromConfig(c hf.Config) (ClampedSwiGLU, error) {
	alpha, err := c.FloatOr("swiglu_alpha", 1.702)
	if err != nil {
		return ClampedSwiGLU{}, err
	}
	limit, err := c.FloatOr("swiglu_limit", 7.0)
	if err != nil {
		return ClampedSwiGLU{}, err
	}
	if err := positive("swiglu_limit", limit); err != nil {
		return ClampedSwiGLU{}, err
	}
	if math.IsNaN(alpha) || math.IsInf(alpha, 0) {
		return ClampedSwiGLU{}, fmt.Errorf("config.json: swiglu_alpha must be finite, got %g", alpha)
	}
	return ClampedSwiGLU{Alpha: alpha, Limit: limit}, nil
}

// Activation combines the gate and up projections (de-interleaved: gpt-oss
// stores gate at even and up at odd rows of gate_up_proj).
func (a ClampedSwiGLU) Activation(f *fn.Func, gate, up fn.Value) fn.Value {
	limit := float32(a.Limit)
	gate = f.Op("Min", []fn.Value{gate, f.Scalar(limit)})
	up = f.Op("Clip", []fn.Value{up, f.Scalar(-limit), f.Scalar(limit)})
	glu := f.Mul(gate, f.Sigmoid(f.Mul(gate, f.Scalar(float32(a.Alpha)))))
	return f.Mul(f.Add(up, f.Scalar(1)), glu)
}
