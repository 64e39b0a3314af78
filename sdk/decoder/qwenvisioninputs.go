package decoder

import (
	"fmt"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
)

// The language model with vision inputs (plugin option vision=true), as
// transformers' Qwen3VLModel.forward (and Qwen3_5Model.forward, without
// DeepStack) feeds its text model image features:
//
//   - vision_embeds [num_vision_tokens, hidden] replaces the embedding of
//     each image token (input_ids == config.image_token_id), row k at the
//     k-th image token counted row-major over [batch, seq];
//   - with DeepStack, after decoder layer i < D, deepstack_features[i]
//     (D = the vision tower's deepstack_visual_indexes) is added at the
//     same positions;
//   - position_ids is [4, batch, seq]: row 0 the sequence position (the
//     cache slot, the causal mask, −1 for padding), rows 1..3 MRoPE's
//     t/h/w rows as get_rope_index computes them.
//
// The inputs are what vision.onnx returns for the step's images; a step
// without image tokens passes 0 rows. Rows that do not number the image
// tokens fail the run (blocks.ReplacePlaceholders and blocks.PlaceRows
// reshape them to the count).

const (
	// VisionOptionName is the plugin option that adds the vision inputs.
	VisionOptionName = "vision"
	// CtxVisionIndex and CtxVisionCount are the context values DeepStack
	// reads: each position's row among the image tokens (the count
	// elsewhere), and the count.
	CtxVisionIndex = "vision_index"
	CtxVisionCount = "vision_count"
)

// QwenVisionOption is the plugin option vision (false, true) of a family.
func QwenVisionOption(fam QwenVisionFamily) *pb.PluginOption {
	inputs := VisionEmbeds
	if fam.DeepStack {
		inputs += ", " + DeepstackFeatures
	}
	return &pb.PluginOption{Name: VisionOptionName, DefaultValue: "false", AllowedValues: []string{"false", "true"},
		Help: "true (also written bare, --vision): model.onnx takes " + inputs + " (vision.onnx's outputs, and vision.onnx is written too) and position_ids [4, batch, seq] (row 0 the sequence position, rows 1..3 MRoPE's t/h/w)"}
}

// AddQwenVisionInputs makes the model take vision inputs. base is each
// layer's kind without them; with DeepStack, layers 0..D-1 get kinds of
// their own (one ONNX function each with --subfunctions), base's body
// followed by DeepStack.
func AddQwenVisionInputs(m *Model, fam QwenVisionFamily, base func(i int) *Kind) error {
	token, err := m.Top.Int("image_token_id")
	if err != nil {
		return fmt.Errorf("--vision true needs the image token: %w", err)
	}
	v, err := ReadQwenVision(m.Top, m.Hidden, fam)
	if err != nil {
		return fmt.Errorf("--vision true needs the vision tower's config: %w", err)
	}
	d := v.DeepStack()
	if d > m.Layers {
		return fmt.Errorf("config.json: vision_config.deepstack_visual_indexes has %d entries, more than the %d decoder layers it feeds", d, m.Layers)
	}
	m.PositionIDsRank, m.PositionRows = 3, 4
	hidden, tokens := DimSize(m.Hidden), DimParam("num_vision_tokens")
	m.ExtraInputs = []*pb.IOSpec{
		{Name: sdk.InputIDs, Dtype: "int64", Shape: []*pb.Dim{DimParam("batch_size"), DimParam("seq_len")}},
		{Name: VisionEmbeds, Dtype: "compute", Shape: []*pb.Dim{tokens, hidden}},
	}
	h := int64(m.Hidden)
	m.Embed = func(f *fn.Func, ids, embedded fn.Value) fn.Value {
		return blocks.ReplacePlaceholders(f.Scope("vision"), embedded, ids, f.Input(VisionEmbeds), int64(token), h)
	}
	if fam.DeepStack {
		m.ExtraInputs = append(m.ExtraInputs, &pb.IOSpec{Name: DeepstackFeatures, Dtype: "compute", Shape: []*pb.Dim{DimSize(d), tokens, hidden}})
		addDeepStack(m, int64(token), d, base)
	}
	return nil
}

// addDeepStack gives layers 0..d-1 kinds of their own that add
// deepstack_features at the image tokens.
func addDeepStack(m *Model, token int64, d int, base func(i int) *Kind) {
	m.AddContext(ContextValue{Name: CtxVisionIndex, Compute: func(c *Context) fn.Value {
		index, _ := blocks.PlaceholderIndex(c.Func, c.Input(sdk.InputIDs), token)
		return index
	}})
	m.AddContext(ContextValue{Name: CtxVisionCount, Compute: func(c *Context) fn.Value {
		_, count := blocks.PlaceholderIndex(c.Func, c.Input(sdk.InputIDs), token)
		return count
	}})
	kinds := make([]*Kind, d)
	for i := range d {
		k := base(i)
		kinds[i] = m.With(k, fmt.Sprintf("%s_deepstack%d", k.Name, i), fmt.Sprintf("%sDeepstack%d", k.Function, i), deepstack(i, int64(m.Hidden)))
	}
	m.KindOf = func(i int) string {
		if i < d {
			return kinds[i].Name
		}
		return base(i).Name
	}
}

// deepstack adds deepstack_features[i] at the image tokens to the layer's
// output (transformers' _deepstack_process after layer i).
func deepstack(i int, hidden int64) func(l *Layer, out fn.Value) fn.Value {
	return func(l *Layer, out fn.Value) fn.Value {
		f := l.Scope("deepstack")
		rows := f.Gather(l.Input(DeepstackFeatures), f.Int(int64(i)), 0)
		return f.Add(out, blocks.PlaceRows(f, rows, l.Context(CtxVisionIndex), l.Context(CtxVisionCount), hidden))
	}
}
