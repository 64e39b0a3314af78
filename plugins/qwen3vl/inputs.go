package main

import (
	"fmt"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/decoder"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// The language model with vision inputs (plugin option vision=true), as
// transformers' Qwen3VLModel.forward feeds its text model image features:
//
//   - vision_embeds [num_vision_tokens, hidden] replaces the embedding of
//     each image token (input_ids == config.image_token_id), row k at the
//     k-th image token counted row-major over [batch, seq];
//   - after decoder layer i < D, deepstack_features[i] (D = the vision
//     tower's deepstack_visual_indexes) is added at the same positions;
//   - position_ids is [4, batch, seq]: row 0 the sequence position (the
//     cache slot, the causal mask, −1 for padding), rows 1..3 MRoPE's
//     t/h/w rows as get_rope_index computes them.
//
// Both inputs are what vision.onnx returns for the step's images; a step
// without image tokens passes 0 rows. Rows that do not number the image
// tokens fail the run (blocks.PlaceRows reshapes them to the count).

const (
	optVision      = "vision"
	inVisionEmbeds = outVisionEmbeds
	inDeepstack    = outDeepstack
	// Context values: each position's row among the image tokens (the
	// count elsewhere), and the count.
	ctxVisionIndex = "vision_index"
	ctxVisionCount = "vision_count"
)

var visionOption = &pb.PluginOption{Name: optVision, DefaultValue: "false", AllowedValues: []string{"false", "true"},
	Help: "true: model.onnx takes vision_embeds, deepstack_features (vision.onnx's outputs) and position_ids [4, batch, seq] (row 0 the sequence position, rows 1..3 MRoPE's t/h/w)"}

// addVisionInputs makes the model take vision inputs. base is each layer's
// kind without them; layers 0..D-1 get kinds of their own (one ONNX
// function each with --subfunctions), base's body followed by DeepStack.
func addVisionInputs(m *decoder.Model, base func(i int) *decoder.Kind) error {
	token, err := m.Top.Int("image_token_id")
	if err != nil {
		return fmt.Errorf("--vision true needs the image token: %w", err)
	}
	v, err := readVision(m.Top, m.Hidden)
	if err != nil {
		return fmt.Errorf("--vision true needs the vision tower's config: %w", err)
	}
	d := len(v.deepstack)
	if d > m.Layers {
		return fmt.Errorf("config.json: vision_config.deepstack_visual_indexes has %d entries, more than the %d decoder layers it feeds", d, m.Layers)
	}
	m.PositionIDsRank, m.PositionRows = 3, 4
	hidden, tokens := decoder.DimSize(m.Hidden), decoder.DimParam("num_vision_tokens")
	m.ExtraInputs = []*pb.IOSpec{
		{Name: sdk.InputIDs, Dtype: "int64", Shape: []*pb.Dim{decoder.DimParam("batch_size"), decoder.DimParam("seq_len")}},
		{Name: inVisionEmbeds, Dtype: "compute", Shape: []*pb.Dim{tokens, hidden}},
		{Name: inDeepstack, Dtype: "compute", Shape: []*pb.Dim{decoder.DimSize(d), tokens, hidden}},
	}
	h := int64(m.Hidden)
	m.Embed = func(f *fn.Func, ids, embedded fn.Value) fn.Value {
		return blocks.ReplacePlaceholders(f.Scope("vision"), embedded, ids, f.Input(inVisionEmbeds), int64(token), h)
	}
	m.AddContext(decoder.ContextValue{Name: ctxVisionIndex, Compute: func(c *decoder.Context) fn.Value {
		index, _ := blocks.PlaceholderIndex(c.Func, c.Input(sdk.InputIDs), int64(token))
		return index
	}})
	m.AddContext(decoder.ContextValue{Name: ctxVisionCount, Compute: func(c *decoder.Context) fn.Value {
		_, count := blocks.PlaceholderIndex(c.Func, c.Input(sdk.InputIDs), int64(token))
		return count
	}})
	kinds := make([]*decoder.Kind, d)
	for i := range d {
		k := base(i)
		kinds[i] = m.With(k, fmt.Sprintf("%s_deepstack%d", k.Name, i), fmt.Sprintf("%sDeepstack%d", k.Function, i), deepstack(i, h))
	}
	m.KindOf = func(i int) string {
		if i < d {
			return kinds[i].Name
		}
		return base(i).Name
	}
	return nil
}

// deepstack adds deepstack_features[i] at the image tokens to the layer's
// output (transformers' _deepstack_process after layer i).
func deepstack(i int, hidden int64) func(l *decoder.Layer, out fn.Value) fn.Value {
	return func(l *decoder.Layer, out fn.Value) fn.Value {
		f := l.Scope("deepstack")
		rows := f.Gather(l.Input(inDeepstack), f.Int(int64(i)), 0)
		return f.Add(out, blocks.PlaceRows(f, rows, l.Context(ctxVisionIndex), l.Context(ctxVisionCount), hidden))
	}
}
