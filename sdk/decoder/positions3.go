package decoder

import (
	"fmt"

	"github.com/strata-llm/strata/sdk/fn"
)

// Position ids of rank 3 (Model.PositionIDsRank = 3): position_ids is
// [3, batch, seq], the temporal, height and width rows of multimodal RoPE
// (Qwen3-VL). The RoPE tables are computed from all three rows
// (RoPE.Tables3); everything else a decoder does with positions — the
// causal mask, the cache read indices, the KV cache writes (CtxScatter)
// and the last-token pick of the final part — uses row 0 alone, the text
// (temporal) positions, [batch, seq], with −1 for padding as in rank 2.
//
// The context part computes row 0 once and outputs it as the context value
// CtxPositions; layers take it in place of position_ids (a layer function
// of a rank-3 model has no position_ids input). The final part, which the
// host hands position_ids as given, picks row 0 itself. Rank-2 models are
// built exactly as before.

// CtxPositions is the context value holding row 0 of rank-3 position_ids,
// [batch, seq] int64: where the cache is written, masked and read.
const CtxPositions = "positions"

// TextPositions is row 0 of position_ids [3, batch, seq]: [batch, seq].
func TextPositions(f *fn.Func, positionIDs3 fn.Value) fn.Value {
	return f.Gather(positionIDs3, f.Int(0), 0)
}

// positions is the layout of position_ids: rank 2 or 3, and with rank 3
// 3 or 4 rows.
type positions struct{ rank, rows int }

func (m *Model) positions() positions {
	p := positions{rank: m.positionRank(), rows: 3}
	if p.rank == 3 && m.PositionRows == 4 {
		p.rows = 4
	}
	return p
}

// positionRank is 2 or 3.
func (m *Model) positionRank() int {
	if m.PositionIDsRank == 3 {
		return 3
	}
	return 2
}

// checkPositionRank refuses a rank other than 0, 2, 3, and rank 3 without
// MRoPE sections (Tables3 would turn every frequency with row 0).
func (m *Model) checkPositionRank() error {
	switch m.PositionIDsRank {
	case 0, 2:
		if m.PositionRows != 0 {
			return fmt.Errorf("the plugin asks for %d position rows with position_ids of rank 2; rows need rank 3", m.PositionRows)
		}
		return nil
	case 3:
		if len(m.RoPE.MRoPESection) != 3 {
			return fmt.Errorf("position_ids of rank 3 need multimodal RoPE (mrope_section in the rope parameters)")
		}
		return m.checkPositionRows()
	}
	return fmt.Errorf("the plugin asks for position_ids of rank %d; the SDK knows ranks 2 and 3", m.PositionIDsRank)
}

// checkPositionRows refuses rows other than 3 and 4 (0 is 3).
func (m *Model) checkPositionRows() error {
	switch m.PositionRows {
	case 0, 3, 4:
		return nil
	}
	return fmt.Errorf("the plugin asks for position_ids of %d rows; the SDK knows 3 (t/h/w) and 4 (text, t/h/w)", m.PositionRows)
}
