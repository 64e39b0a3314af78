package blocks

import "github.com/strata-llm/strata/sdk/fn"

// Placeholder tokens: a multimodal prompt holds one token id (Qwen3-VL's
// image_token_id) where each row of an encoder's output goes, row k at the
// k-th such token counted row-major over [batch, seq] (what torch's
// masked_scatter does).

// PlaceholderIndex numbers the placeholder tokens of ids [B,S] int64:
// index [B,S] is k at the k-th placeholder and count (the number of them,
// a scalar) elsewhere, so that PlaceRows reads a zero row there; count
// [1] is what the rows must number.
func PlaceholderIndex(f *fn.Func, ids fn.Value, token int64) (index, count fn.Value) {
	is := f.Op("Equal", []fn.Value{ids, f.Int(token)})
	flat := f.Reshape(f.Cast(is, fn.Int64), -1)
	seen := f.Op("CumSum", []fn.Value{flat, f.Int(0)}) // k+1 at the k-th placeholder
	count = f.ReduceSum(flat, true, 0)                 // [1]
	index = f.Where(is, f.Op("Reshape", []fn.Value{f.Sub(seen, f.Int(1)), f.Shape(ids)}), count)
	return index, count
}

// PlaceRows spreads rows [N, width] over [B,S,width] by index and count
// (PlaceholderIndex): row index[b,s], or zeros where index is count. The
// rows are first reshaped to [count, width], so rows that do not number
// the placeholders fail the run (as transformers refuses them) instead of
// being read short or partly; zero rows work with zero placeholders.
func PlaceRows(f *fn.Func, rows, index, count fn.Value, width int64) fn.Value {
	// allowzero: a 0 in the shape is zero rows, not "keep the input's dim".
	checked := f.Op("Reshape", []fn.Value{rows, f.Concat(0, count, f.Ints(width))}, fn.AttrInt("allowzero", 1))
	zero := f.Op("ConstantOfShape", []fn.Value{f.Ints(1, width)}, fn.AttrTensor("value", fn.MustFloatTensor(f.DType(), 0)))
	return f.Gather(f.Concat(0, checked, zero), index, 0)
}

// ReplacePlaceholders puts rows [N, width] in place of the embeddings
// [B,S,width] of the placeholder tokens of ids (transformers'
// masked_scatter of image features); other positions keep theirs.
func ReplacePlaceholders(f *fn.Func, embedded, ids, rows fn.Value, token, width int64) fn.Value {
	index, count := PlaceholderIndex(f, ids, token)
	is := f.Unsqueeze(f.Op("Equal", []fn.Value{ids, f.Int(token)}), -1)
	return f.Where(is, PlaceRows(f, rows, index, count, width), embedded)
}
