package gptoss

import (
	"fmt"
	"slices"

	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/weight"
)

type weightExpr = weight.Expr

// expertLayout is how a layer stores its experts, found from the keys (re-
// saves differ from the Hub release, so the config does not tell).
type expertLayout int

const (
	// mxfp4: the Hub release. mlp.experts.gate_up_proj_blocks [E, 2I, H/32,
	// 16] U8 + _scales [E, 2I, H/32] U8, down_proj_blocks [E, H, I/32, 16] +
	// _scales: rows are output features (transposed against transformers'
	// [E, in, out]); gate_up rows interleaved (gate = even, up = odd);
	// biases gate_up_proj_bias [E, 2I], down_proj_bias [E, H].
	mxfp4 expertLayout = iota + 1
	// fused: what transformers saves (dequantised): gate_up_proj [E, H, 2I]
	// with interleaved columns, down_proj [E, I, H], the same biases.
	fused
)

const (
	gateUp = "mlp.experts.gate_up_proj"
	down   = "mlp.experts.down_proj"
)

// detectLayout finds layer l's expert layout and checks what Check's shape
// comparison cannot say clearly: MXFP4 blocks and scales that disagree, and
// their dtypes.
func (c config) detectLayout(m *decoder.Model, l int32) (expertLayout, error) {
	if m.HasLayerTensor(l, gateUp+"_blocks") || m.HasLayerTensor(l, gateUp+"_scales") {
		h, i := int64(m.Hidden), int64(c.intermediate)
		if h%32 != 0 || i%32 != 0 {
			return 0, fmt.Errorf("config.json: MXFP4 experts need hidden_size (%d) and intermediate_size (%d) to be multiples of 32", h, i)
		}
		if err := c.checkMXFP4(m, l, gateUp, 2*i, h); err != nil {
			return 0, err
		}
		if err := c.checkMXFP4(m, l, down, h, i); err != nil {
			return 0, err
		}
		return mxfp4, nil
	}
	if m.HasLayerTensor(l, gateUp) {
		return fused, nil
	}
	return 0, fmt.Errorf("layer %d holds neither MXFP4 experts (%s) nor dequantised ones (%s)",
		l, m.LayerKey(l, gateUp+"_blocks"), m.LayerKey(l, gateUp))
}

// checkMXFP4 checks name's blocks and scales of layer l: both U8, blocks
// [E, rows, cols/32, 16], scales the blocks' shape without the last axis.
func (c config) checkMXFP4(m *decoder.Model, l int32, name string, rows, cols int64) error {
	bk, sk := name+"_blocks", name+"_scales"
	b, okB := m.LayerTensor(l, bk)
	s, okS := m.LayerTensor(l, sk)
	switch {
	case !okB:
		return fmt.Errorf("layer %d has %s but no %s", l, m.LayerKey(l, sk), m.LayerKey(l, bk))
	case !okS:
		return fmt.Errorf("layer %d has %s but no %s", l, m.LayerKey(l, bk), m.LayerKey(l, sk))
	}
	for _, t := range []struct {
		key, dtype string
	}{{bk, b.GetDtype()}, {sk, s.GetDtype()}} {
		if t.dtype != "U8" {
			return fmt.Errorf("tensor %s is %s; MXFP4 %s must be U8", m.LayerKey(l, t.key), t.dtype, t.key[len(name)+1:])
		}
	}
	if len(b.Shape) < 1 || !slices.Equal(b.Shape[:len(b.Shape)-1], s.Shape) {
		return fmt.Errorf("MXFP4 blocks %s %v and scales %s %v disagree: the scales must be the blocks' shape without its last axis",
			m.LayerKey(l, bk), b.Shape, m.LayerKey(l, sk), s.Shape)
	}
	want := []int64{int64(c.experts), rows, cols / 32, 16}
	if !slices.Equal(b.Shape, want) {
		return fmt.Errorf("tensor %s has shape %v; config.json implies %v", m.LayerKey(l, bk), b.Shape, want)
	}
	return nil
}

type expertPart int

const (
	gateW expertPart = iota
	upW
	downW
	gateB
	upB
	downB
)

// expr is the weight expression of layer l's expert part: weights as the
// second matmul operand, gate and up [E, H, I], down [E, I, H]; biases
// gate and up [E, I], down [E, H].
func (lay expertLayout) expr(c config, m *decoder.Model, l int32, p expertPart) weight.Expr {
	e, h, i := int64(c.experts), int64(m.Hidden), int64(c.intermediate)
	switch p {
	case gateB, upB:
		return weight.Slice(weight.Tensor(m.LayerKey(l, gateUp+"_bias"), e, 2*i), 1, int64(p-gateB), 0, 2)
	case downB:
		return weight.Tensor(m.LayerKey(l, down+"_bias"), e, h)
	}
	if lay == mxfp4 {
		deq := func(name string, rows, cols int64) weight.Expr { // [E, rows, cols]
			return weight.MXFP4(weight.Tensor(m.LayerKey(l, name+"_blocks"), e, rows, cols/32, 16),
				weight.Tensor(m.LayerKey(l, name+"_scales"), e, rows, cols/32))
		}
		if p == downW {
			return weight.Transpose(deq(down, h, i), 0, 2, 1)
		}
		return weight.Transpose(weight.Slice(deq(gateUp, 2*i, h), 1, int64(p-gateW), 0, 2), 0, 2, 1)
	}
	if p == downW {
		return weight.Tensor(m.LayerKey(l, down), e, i, h)
	}
	return weight.Slice(weight.Tensor(m.LayerKey(l, gateUp), e, h, 2*i), 2, int64(p-gateW), 0, 2)
}
