package blocks

import (
	"github.com/strata-llm/strata/sdk/fn"

	onnxpb "github.com/strata-llm/strata/sdk/onnx"
)

// Custom-op domains the Qualcomm toolchain recognises. Each op is shipped in
// the model as a function with a reference body of standard ops, so ONNX
// Runtime runs the same file the compiler consumes.
const (
	QualcommDomain = "com.qualcomm.cloud"
	QTIDomain      = "com.qti.aisw.onnx"
)

// The custom-op functions are type-generic and have no compute-dtype
// constants; the dtype given to their builders is never used.

// CtxScatterFunc is CtxScatter(data [B,H,C,D], position_ids [B,S], updates
// [B,H,S,D]) -> data with updates[b,h,s] written at row position_ids[b,s].
// A position of -1 (padding) addresses the last row, which stays masked
// until a real token is written there.
func CtxScatterFunc() *onnxpb.FunctionProto {
	f := fn.NewFunc(QualcommDomain, "CtxScatter", fn.Float32)
	data, pos, updates := f.Input("data"), f.Input("position_ids"), f.Input("updates")
	batch := f.Dim(data, 0)
	rows := f.Unsqueeze(f.Range(f.Int(0), batch, f.Int(1)), 1, 2, 3)
	indices := cacheIndices(f, rows, f.Unsqueeze(pos, 1, 3), batch, f.Dim(data, 1), f.Dim(pos, 1))
	f.Output("output", f.Op("ScatterND", []fn.Value{data, indices, updates}))
	return f.Proto()
}

// cacheIndices are the [B,H,L,3] (row, head, slot) indices into a
// [rows,H,C,D] cache, from each batch row's cache row [B,1,1,1] and slots
// [B,1,L,1].
func cacheIndices(f *fn.Func, rows, slots, batch, heads, length fn.Value) fn.Value {
	shape := f.Concat(0, f.Unsqueeze(batch, 0), f.Unsqueeze(heads, 0), f.Unsqueeze(length, 0), f.Ints(1))
	expand := func(v fn.Value) fn.Value { return f.Op("Expand", []fn.Value{v, shape}) }
	headIdx := f.Unsqueeze(f.Range(f.Int(0), heads, f.Int(1)), 0, 2, 3)
	return f.Concat(3, expand(rows), expand(headIdx), expand(slots))
}

// CtxGatherFunc is CtxGather(data [B,H,C,D], ctx_indices [B,1,L],
// comp_ctx_len scalar L) -> [B,H,L,D], the cache rows at ctx_indices.
func CtxGatherFunc() *onnxpb.FunctionProto {
	f := fn.NewFunc(QualcommDomain, "CtxGather", fn.Float32)
	data, indices, length := f.Input("data"), f.Input("ctx_indices"), f.Input("comp_ctx_len")
	batchHeads := f.Op("Shape", []fn.Value{data}, fn.AttrInt("end", 2))
	shape := f.Concat(0, batchHeads, f.Reshape(length, 1))
	expanded := f.Unsqueeze(f.Op("Expand", []fn.Value{indices, shape}), -1)
	f.Output("output", f.Op("GatherND", []fn.Value{data, expanded}, fn.AttrInt("batch_dims", 2)))
	return f.Proto()
}

// CtxScatterCBFunc is CtxScatterCB(data [FBS,H,C,D], batch_index [B,1],
// position_ids [B,S], updates [B,H,S,D]): CtxScatter into the cache rows
// batch_index names (continuous batching).
func CtxScatterCBFunc() *onnxpb.FunctionProto {
	f := fn.NewFunc(QualcommDomain, "CtxScatterCB", fn.Float32)
	data, batchIndex, pos, updates := f.Input("data"), f.Input("batch_index"), f.Input("position_ids"), f.Input("updates")
	indices := cacheIndices(f, f.Unsqueeze(batchIndex, 2, 3), f.Unsqueeze(pos, 1, 3), f.Dim(batchIndex, 0), f.Dim(data, 1), f.Dim(pos, 1))
	f.Output("output", f.Op("ScatterND", []fn.Value{data, indices, updates}))
	return f.Proto()
}

// CtxGatherCBFunc is CtxGatherCB(data [FBS,H,C,D], batch_index [B,1],
// ctx_indices [B,1,L], comp_ctx_len) -> [B,H,L,D]: the rows of each batch
// row's cache. L comes from ctx_indices' shape (the compiler rejects an
// Expand by a computed length inside functions); comp_ctx_len is kept for
// the op's signature.
func CtxGatherCBFunc() *onnxpb.FunctionProto {
	f := fn.NewFunc(QualcommDomain, "CtxGatherCB", fn.Float32)
	data, batchIndex, slots := f.Input("data"), f.Input("batch_index"), f.Input("ctx_indices")
	f.Input("comp_ctx_len")
	indices := cacheIndices(f, f.Unsqueeze(batchIndex, 2, 3), f.Unsqueeze(slots, 3), f.Dim(batchIndex, 0), f.Dim(data, 1), f.Dim(slots, 2))
	f.Output("output", f.Op("GatherND", []fn.Value{data, indices}))
	return f.Proto()
}

// CustomRMSNormFunc is CustomRMSNorm(hidden_states, weight; epsilon):
// hidden_states * rsqrt(mean(hidden_states², -1) + epsilon), computed in
// float32 and cast back before the weight multiplies it, as transformers'
// Llama-style RMSNorm does.
func CustomRMSNormFunc() *onnxpb.FunctionProto {
	f := fn.NewFunc(QTIDomain, "CustomRMSNorm", fn.Float32)
	x, w := f.Input("hidden_states"), f.Input("weight")
	f.Attribute("epsilon")
	x32 := f.Cast(x, fn.Float32)
	variance := f.ReduceMean(f.Mul(x32, x32), true, -1)
	eps := f.Op("Constant", nil, fn.AttrRef("value_float", onnxpb.AttributeProto_FLOAT, "epsilon"))
	inv := f.Op("Reciprocal", []fn.Value{f.Op("Sqrt", []fn.Value{f.Add(variance, eps)})})
	normed := f.CastLike(f.Mul(x32, inv), x)
	f.Output("output", f.Mul(f.CastLike(w, x), normed))
	return f.Proto()
}
