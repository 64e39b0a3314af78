package decoder

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/strata-llm/strata/sdk"
	"github.com/strata-llm/strata/sdk/blocks"
	"github.com/strata-llm/strata/sdk/fn"
	"github.com/strata-llm/strata/sdk/hf"
	pb "github.com/strata-llm/strata/sdk/proto/pluginv1"
	"github.com/strata-llm/strata/sdk/weight"
)

// The Qwen vision encoder as its own model, vision.onnx (strata export
// --extra-model vision), as transformers' Qwen3VLVisionModel computes it and
// Qwen3.5's (Qwen3_5VisionModel, the same tower without DeepStack) inherits
// it: patch embedding (the Conv3d as a matmul over each flattened patch),
// the learned position table resampled bilinearly (align_corners) to each
// image's grid, 2-D rotary embeddings over the patch rows and columns,
// non-causal attention within each frame, the merger and, for Qwen3-VL, the
// DeepStack mergers. Everything that depends on the grids (per-patch image,
// frame, row and column, interpolation taps) is computed in the graph from
// image_grid_thw, so any grid runs.
//
// Inputs: pixel_values [num_patches, C·T·P·P] (as the HF image processor
// flattens them), image_grid_thw [num_images, 3] int64. Outputs:
// vision_embeds [num_patches / merge², out_hidden] and, with DeepStack,
// deepstack_features [D, num_patches / merge², out_hidden].

// The vision model's name (--extra-model) and its inputs and outputs, which
// are also the language model's vision inputs (AddQwenVisionInputs).
const (
	VisionModel       = "vision"
	PixelValues       = "pixel_values"
	ImageGridTHW      = "image_grid_thw"
	VisionEmbeds      = "vision_embeds"
	DeepstackFeatures = "deepstack_features"
	visionLayerNormEp = 1e-6
)

// QwenVisionFamily is what differs between the architectures sharing the
// Qwen vision tower.
type QwenVisionFamily struct {
	Plugin string // in messages: "qwen3vl"
	Model  string // in the vision model's help: "Qwen3-VL"
	// DeepStack: vision_config.deepstack_visual_indexes names the blocks
	// whose merged output (deepstack_merger_list) is added to the language
	// model's hidden state after its first layers (Qwen3-VL). Without it
	// (Qwen3.5) the field must be absent or empty.
	DeepStack bool
}

// QwenVision is a checkpoint's vision tower: vision_config and where its
// tensors are.
type QwenVision struct {
	depth, hidden, intermediate, heads, inChannels, patch, temporalPatch, merge, positions, out int
	deepstack                                                                                   []int
	theta                                                                                       float64
	// prefix is where the checkpoint holds the tower: one of visionPrefixes.
	prefix string
	family QwenVisionFamily
}

// visionPrefixes are where transformers loads the vision tower from:
// model.visual. as it saves a *ForConditionalGeneration, visual. as the
// base model (Qwen3VLModel, Qwen3_5Model) saves it (whichever layout the
// language model is in).
var visionPrefixes = []string{"model.visual.", "visual."}

// VisionPrefix is where a *ForConditionalGeneration checkpoint holds the
// vision tower.
const VisionPrefix = "model.visual."

// visionKnown are the vision_config fields read or known not to change
// the math; any other field is refused (it may).
var visionKnown = []string{"deepstack_visual_indexes", "depth", "hidden_act", "hidden_size", "in_channels",
	"initializer_range", "intermediate_size", "model_type", "num_heads", "num_position_embeddings", "out_hidden_size",
	"patch_size", "spatial_merge_size", "temporal_patch_size", "rope_parameters", "dtype", "torch_dtype"}

// DeepStack is the number of DeepStack features (0 without DeepStack).
func (c QwenVision) DeepStack() int { return len(c.deepstack) }

// ReadQwenVision reads top's vision_config; textHidden is the language
// model's hidden size, which the tower's output must have.
func ReadQwenVision(top hf.Config, textHidden int, fam QwenVisionFamily) (QwenVision, error) {
	v, ok, err := top.Object("vision_config")
	if err != nil || !ok {
		return QwenVision{}, fmt.Errorf("config.json: no vision_config")
	}
	for _, k := range v.Keys() {
		if !slices.Contains(visionKnown, k) {
			return QwenVision{}, fmt.Errorf("config.json: vision_config.%s is not known to the %s plugin (it may change the vision math)", k, fam.Plugin)
		}
	}
	r := &hf.Reader{Config: v}
	c := QwenVision{depth: r.Int("depth"), hidden: r.Int("hidden_size"), intermediate: r.Int("intermediate_size"),
		heads: r.Int("num_heads"), inChannels: r.IntOr("in_channels", 3), patch: r.Int("patch_size"),
		temporalPatch: r.IntOr("temporal_patch_size", 2), merge: r.IntOr("spatial_merge_size", 2),
		positions: r.Int("num_position_embeddings"), out: r.Int("out_hidden_size"), theta: 10000, family: fam}
	if fam.DeepStack || v.Has("deepstack_visual_indexes") {
		c.deepstack = r.Ints("deepstack_visual_indexes")
	}
	act := r.StringOr("hidden_act", "gelu_pytorch_tanh")
	if rp, ok := r.Object("rope_parameters"); ok {
		rr := &hf.Reader{Config: rp}
		if typ := rr.StringOr("rope_type", "axial"); typ != "axial" {
			return c, fmt.Errorf("config.json: vision_config.rope_parameters.rope_type %q (only axial)", typ)
		}
		c.theta = rr.FloatOr("rope_theta", 10000)
		if rr.Err != nil {
			return c, rr.Err
		}
	}
	if r.Err != nil {
		return c, r.Err
	}
	if err := c.check(act, textHidden); err != nil {
		return c, err
	}
	return c, c.checkDeepStack()
}

// check refuses sizes the graph cannot take and math it does not compute.
func (c QwenVision) check(act string, textHidden int) error {
	side := int(math.Sqrt(float64(c.positions)))
	switch {
	case act != "gelu_pytorch_tanh":
		return fmt.Errorf("config.json: vision_config.hidden_act %q (only gelu_pytorch_tanh)", act)
	case c.depth <= 0 || c.hidden <= 0 || c.heads <= 0 || c.hidden%c.heads != 0 || (c.hidden/c.heads)%4 != 0:
		return fmt.Errorf("config.json: vision_config depth %d, hidden_size %d, num_heads %d: need positive sizes and a head dim divisible by 4", c.depth, c.hidden, c.heads)
	case side*side != c.positions:
		return fmt.Errorf("config.json: vision_config.num_position_embeddings %d is not a square", c.positions)
	case c.out != textHidden:
		return fmt.Errorf("config.json: vision_config.out_hidden_size %d differs from text hidden_size %d", c.out, textHidden)
	case c.merge <= 0 || c.patch <= 0 || c.temporalPatch <= 0 || c.inChannels <= 0 || c.intermediate <= 0:
		return fmt.Errorf("config.json: vision_config sizes must be positive")
	}
	return nil
}

// checkDeepStack refuses DeepStack indexes the family does not have or the
// depth does not hold.
func (c QwenVision) checkDeepStack() error {
	switch {
	case c.family.DeepStack && len(c.deepstack) == 0:
		return fmt.Errorf("config.json: vision_config.deepstack_visual_indexes is empty")
	case !c.family.DeepStack && len(c.deepstack) > 0:
		return fmt.Errorf("config.json: vision_config.deepstack_visual_indexes is %v; %s's vision tower has no DeepStack mergers (remove the field or make it empty)", c.deepstack, c.family.Model)
	}
	for _, d := range c.deepstack {
		if d < 0 || d >= c.depth {
			return fmt.Errorf("config.json: vision_config.deepstack_visual_indexes %v: index %d outside 0..depth-1", c.deepstack, d)
		}
	}
	return nil
}

// AddQwenVision declares vision.onnx when the config and the tensors allow
// it; otherwise it notes why not (the language model still exports).
func AddQwenVision(m *Model, fam QwenVisionFamily) {
	c, err := ReadQwenVision(m.Top, m.Hidden, fam)
	if err == nil {
		c.prefix, err = m.Inventory.PickPrefix("the vision tower", "", visionPrefixes)
		if errors.Is(err, sdk.ErrNoLayout) { // checkTensors names the missing tensors
			c.prefix, err = visionPrefixes[0], nil
		}
	}
	if err == nil {
		err = c.checkTensors(m)
	}
	if err != nil {
		m.Note("the vision model is not available: %v", err)
		return
	}
	patches, tokens := DimParam("num_patches"), DimParam("num_vision_tokens")
	outputs, help := []*pb.IOSpec{{Name: VisionEmbeds, Dtype: "compute", Shape: []*pb.Dim{tokens, DimSize(c.out)}}}, VisionEmbeds
	if fam.DeepStack {
		outputs = append(outputs, &pb.IOSpec{Name: DeepstackFeatures, Dtype: "compute",
			Shape: []*pb.Dim{DimSize(len(c.deepstack)), tokens, DimSize(c.out)}})
		help += ", " + DeepstackFeatures
	}
	m.AddModel(&pb.ModelSpec{Name: VisionModel,
		// --vision asks for vision.onnx too, as --mtp draft does for mtp.onnx:
		// model.onnx then takes its outputs.
		ByDefault: m.Options[VisionOptionName] == "true",
		Help:      fam.Model + " vision encoder: pixel_values + image_grid_thw -> " + help,
		Inputs: []*pb.IOSpec{
			{Name: PixelValues, Dtype: "compute", Shape: []*pb.Dim{patches, DimSize(c.patchValues())}},
			{Name: ImageGridTHW, Dtype: "int64", Shape: []*pb.Dim{DimParam("num_images"), DimSize(3)}}},
		Outputs: outputs,
	}, c.build)
}

func (c QwenVision) patchValues() int { return c.inChannels * c.temporalPatch * c.patch * c.patch }

// Tensors are the vision tower's, by formal input name (the key without
// its prefix), with their shapes.
func (c QwenVision) Tensors() [][2]any {
	hv, iv, merged, out := int64(c.hidden), int64(c.intermediate), int64(c.hidden*c.merge*c.merge), int64(c.out)
	ts := [][2]any{{"patch_embed.proj.weight", []int64{hv, int64(c.inChannels), int64(c.temporalPatch), int64(c.patch), int64(c.patch)}},
		{"patch_embed.proj.bias", []int64{hv}}, {"pos_embed.weight", []int64{int64(c.positions), hv}}}
	lin := func(name string, o, i int64) {
		ts = append(ts, [2]any{name + ".weight", []int64{o, i}}, [2]any{name + ".bias", []int64{o}})
	}
	for b := range c.depth {
		p := fmt.Sprintf("blocks.%d.", b)
		ts = append(ts, [2]any{p + "norm1.weight", []int64{hv}}, [2]any{p + "norm1.bias", []int64{hv}},
			[2]any{p + "norm2.weight", []int64{hv}}, [2]any{p + "norm2.bias", []int64{hv}})
		lin(p+"attn.qkv", 3*hv, hv)
		lin(p+"attn.proj", hv, hv)
		lin(p+"mlp.linear_fc1", iv, hv)
		lin(p+"mlp.linear_fc2", hv, iv)
	}
	merger := func(p string, norm int64) {
		ts = append(ts, [2]any{p + "norm.weight", []int64{norm}}, [2]any{p + "norm.bias", []int64{norm}})
		lin(p+"linear_fc1", merged, merged)
		lin(p+"linear_fc2", out, merged)
	}
	merger("merger.", hv)
	for k := range c.deepstack {
		merger(fmt.Sprintf("deepstack_merger_list.%d.", k), merged)
	}
	return ts
}

func (c QwenVision) checkTensors(m *Model) error {
	var missing []string
	for _, t := range c.Tensors() {
		key, shape := c.prefix+t[0].(string), t[1].([]int64)
		info, ok := m.Inventory[key]
		switch {
		case !ok:
			missing = append(missing, key)
		case !slices.Equal(info.GetShape(), shape):
			return fmt.Errorf("tensor %s has shape %v; vision_config implies %v", key, info.GetShape(), shape)
		}
		if len(missing) >= 3 {
			break
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the checkpoint lacks vision tensors %s", strings.Join(missing, ", "))
	}
	return nil
}

// build writes the vision model into f.
func (c QwenVision) build(f *fn.Func) (*pb.BuildResponse, error) {
	pixels, grid := f.Input(PixelValues), f.Input(ImageGridTHW)
	w := map[string]fn.Value{}
	var bindings []*pb.WeightBinding
	for _, t := range c.Tensors() {
		name, shape := t[0].(string), t[1].([]int64)
		w[name] = f.Input(name)
		e := weight.Tensor(c.prefix+name, shape...)
		if name == "patch_embed.proj.weight" { // the Conv3d over a whole patch is a Linear
			e = weight.Reshape(e, int64(c.hidden), int64(c.patchValues()))
		}
		bindings = append(bindings, weight.Bind(name, e))
	}
	lin := func(g *fn.Func, name string, x fn.Value) fn.Value {
		return blocks.Linear{Weight: w[name+".weight"], Bias: w[name+".bias"]}.Apply(g.Scope(name), x)
	}
	norm := func(g *fn.Func, name string, x fn.Value) fn.Value {
		return g.Op("LayerNormalization", []fn.Value{x, w[name+".weight"], w[name+".bias"]},
			fn.AttrInt("axis", -1), fn.AttrFloat("epsilon", visionLayerNormEp))
	}

	pixels, grid = c.checkInputs(f.Scope("check"), pixels, grid)
	geo := c.geometry(f.Scope("grid"), pixels, grid)
	x := lin(f, "patch_embed.proj", pixels)
	x = f.Add(x, c.positionEmbedding(f.Scope("pos_embed"), w["pos_embed.weight"], geo))
	cos, sin := c.rotary(f.Scope("rotary"), geo)
	mask := f.Op("Not", []fn.Value{f.Op("Equal", []fn.Value{f.Unsqueeze(geo.segment, 1), f.Unsqueeze(geo.segment, 0)})}) // [N,N]

	var deep []fn.Value
	for b := range c.depth {
		g := f.Scope(fmt.Sprintf("blocks.%d", b))
		p := fmt.Sprintf("blocks.%d.", b)
		h := norm(g.Scope("norm1"), p+"norm1", x)
		x = f.Add(x, lin(g, p+"attn.proj", c.attention(g.Scope("attn"), lin(g, p+"attn.qkv", h), cos, sin, mask)))
		h = norm(g.Scope("norm2"), p+"norm2", x)
		x = f.Add(x, lin(g, p+"mlp.linear_fc2", geluTanh(g.Scope("mlp"), lin(g, p+"mlp.linear_fc1", h))))
		if k := slices.Index(c.deepstack, b); k >= 0 {
			mp := fmt.Sprintf("deepstack_merger_list.%d.", k)
			mg := f.Scope(strings.TrimSuffix(mp, "."))
			y := norm(mg.Scope("norm"), mp+"norm", c.mergeTokens(mg, x))
			deep = append(deep, f.Unsqueeze(lin(mg, mp+"linear_fc2", geluErf(mg, lin(mg, mp+"linear_fc1", y))), 0))
		}
	}
	mg := f.Scope("merger")
	y := c.mergeTokens(mg, norm(mg.Scope("norm"), "merger.norm", x))
	f.Output(VisionEmbeds, lin(mg, "merger.linear_fc2", geluErf(mg, lin(mg, "merger.linear_fc1", y))))
	if c.family.DeepStack {
		f.Output(DeepstackFeatures, f.Concat(0, deep...))
	}
	return Response(f, &pb.LayerWeights{Layer: sdk.NonLayer, Bindings: bindings}), nil
}

// checkInputs makes the runtime refuse inputs the grids do not describe:
// a patch count other than Σ t·h·w, or a height or width that is not a
// multiple of spatial_merge_size, becomes an out-of-range gather index
// (a check ONNX Runtime's optimiser cannot fold away, unlike a Reshape or a
// Gather over a Range); the grid the rest reads passes through it.
func (c QwenVision) checkInputs(f *fn.Func, pixels, grid fn.Value) (fn.Value, fn.Value) {
	h, w := f.Gather(grid, f.Int(1), 1), f.Gather(grid, f.Int(2), 1)
	counts := f.Mul(f.Mul(f.Gather(grid, f.Int(0), 1), h), w)
	mismatch := f.Op("Abs", []fn.Value{f.Sub(f.Dim(pixels, 0), f.ReduceSum(counts, false, 0))})
	m := f.Int(int64(c.merge))
	misfit := f.ReduceSum(f.Add(f.Op("Mod", []fn.Value{h, m}), f.Op("Mod", []fn.Value{w, m})), false, 0)
	zero := f.Gather(f.Ints(0), f.Add(mismatch, misfit), 0) // index 0 only when both are 0
	return pixels, f.Add(grid, zero)
}

// mergeTokens views [N, Hv] as [N/merge², merge²·Hv].
func (c QwenVision) mergeTokens(f *fn.Func, x fn.Value) fn.Value {
	return f.Reshape(x, -1, int64(c.hidden*c.merge*c.merge))
}

// geometry is each patch's place, from the grids: its row and column in its
// image (patches come in merge×merge blocks, row-major over blocks), the
// image's height and width, and its attention segment (one per frame).
type geometry struct {
	row, col, height, width, segment fn.Value // [N] int64
}

func (c QwenVision) geometry(f *fn.Func, pixels, grid fn.Value) geometry {
	col3 := func(i int64) fn.Value { return f.Gather(grid, f.Int(i), 1) } // [I]
	t, h, w := col3(0), col3(1), col3(2)
	frame := f.Mul(h, w)
	counts := f.Mul(t, frame)
	ends := f.Op("CumSum", []fn.Value{counts, f.Int(0)})
	starts := f.Sub(ends, counts)
	framesBefore := f.Sub(f.Op("CumSum", []fn.Value{t, f.Int(0)}), t)
	n := f.Range(f.Int(0), f.Dim(pixels, 0), f.Int(1)) // [N]
	// image of patch n: how many images end at or before it
	img := f.ReduceSum(f.Cast(f.Op("GreaterOrEqual", []fn.Value{f.Unsqueeze(n, 1), f.Unsqueeze(ends, 0)}), fn.Int64), false, 1)
	hN, wN, fN := f.Gather(h, img, 0), f.Gather(w, img, 0), f.Gather(frame, img, 0)
	local := f.Sub(n, f.Gather(starts, img, 0))
	within := f.Op("Mod", []fn.Value{local, fN})
	m := f.Int(int64(c.merge))
	mm := f.Int(int64(c.merge * c.merge))
	blocksW := f.Div(wN, m)
	inCol := f.Op("Mod", []fn.Value{within, m})
	inRow := f.Op("Mod", []fn.Value{f.Div(within, m), m})
	blockCol := f.Op("Mod", []fn.Value{f.Div(within, mm), blocksW})
	blockRow := f.Div(within, f.Mul(mm, blocksW))
	return geometry{
		row: f.Add(f.Mul(blockRow, m), inRow), col: f.Add(f.Mul(blockCol, m), inCol), height: hN, width: wN,
		segment: f.Add(f.Gather(framesBefore, img, 0), f.Div(local, fN)),
	}
}

// positionEmbedding resamples the learned side×side table to each patch's
// place: bilinear, align_corners, as transformers' interpolation taps.
func (c QwenVision) positionEmbedding(f *fn.Func, table fn.Value, g geometry) fn.Value {
	side := int64(math.Sqrt(float64(c.positions)))
	axis := func(index, size fn.Value) (taps [2]fn.Value, weights [2]fn.Value) {
		src := f.Mul(f.Cast(index, fn.Float32), f.ScalarOf(fn.Float32, float32(side-1)))
		denom := f.Cast(f.Op("Max", []fn.Value{f.Sub(size, f.Int(1)), f.Int(1)}), fn.Float32)
		src = f.Div(src, denom)
		floor := f.Op("Floor", []fn.Value{src})
		base := f.Cast(floor, fn.Int64)
		frac := f.Sub(src, floor)
		for o := range 2 {
			tap := f.Op("Clip", []fn.Value{f.Add(base, f.Int(int64(o))), f.Int(0), f.Int(side - 1)})
			dist := f.Op("Abs", []fn.Value{f.Sub(frac, f.ScalarOf(fn.Float32, float32(o)))})
			wt := f.Op("Max", []fn.Value{f.Sub(f.ScalarOf(fn.Float32, 1), dist), f.ScalarOf(fn.Float32, 0)})
			taps[o], weights[o] = tap, wt
		}
		return taps, weights
	}
	ht, hw := axis(g.row, g.height)
	wt, ww := axis(g.col, g.width)
	var sum fn.Value
	for i := range 2 {
		for j := range 2 {
			idx := f.Add(f.Mul(ht[i], f.Int(side)), wt[j])
			wgt := f.Unsqueeze(f.CastTo(f.Mul(hw[i], ww[j]), fn.Float32, f.DType()), 1)
			term := f.Mul(f.Gather(table, idx, 0), wgt)
			if sum == "" {
				sum = term
			} else {
				sum = f.Add(sum, term)
			}
		}
	}
	return sum
}

// rotary is cos and sin [N, 1, head_dim] (float32): frequencies over
// head_dim/4 turned by the row, then the same by the column, the pair
// repeated (rotate-half layout).
func (c QwenVision) rotary(f *fn.Func, g geometry) (cos, sin fn.Value) {
	hd := c.hidden / c.heads
	inv := blocks.RoPE{Type: "default", Base: c.theta, Dim: hd / 2}.InvFreq()
	freqs := func(p fn.Value) fn.Value { return f.Mul(f.Unsqueeze(f.Cast(p, fn.Float32), 1), f.Floats(inv...)) }
	fr, fc := freqs(g.row), freqs(g.col)
	part := func(op string) fn.Value {
		a, b := f.Op(op, []fn.Value{fr}), f.Op(op, []fn.Value{fc})
		hw := f.Concat(-1, a, b)
		return f.Unsqueeze(f.Concat(-1, hw, hw), 1)
	}
	return part("Cos"), part("Sin")
}

// attention is multi-head attention within each segment, with the rotary
// embedding applied to queries and keys in float32. qkv is [N, 3·Hv].
func (c QwenVision) attention(f *fn.Func, qkv, cos, sin, mask fn.Value) fn.Value {
	hd := int64(c.hidden / c.heads)
	heads := int64(c.heads)
	parts := f.Split(f.Reshape(qkv, 0, 3, heads, hd), 1, 1, 1, 1)
	one := func(i int) fn.Value { return f.Reshape(parts[i], 0, heads, hd) } // [N, nh, hd]
	rope := func(x fn.Value) fn.Value {
		x32 := f.CastTo(x, f.DType(), fn.Float32)
		halves := f.Split(x32, -1, hd/2, hd/2)
		rot := f.Concat(-1, f.Neg(halves[1]), halves[0])
		return f.CastTo(f.Add(f.Mul(x32, cos), f.Mul(rot, sin)), fn.Float32, f.DType())
	}
	q := f.Transpose(rope(one(0)), 1, 0, 2) // [nh, N, hd]
	k := f.Transpose(rope(one(1)), 1, 2, 0) // [nh, hd, N]
	v := f.Transpose(one(2), 1, 0, 2)
	scores := f.Mul(f.MatMul(q, k), f.Scalar(float32(math.Pow(float64(hd), -0.5))))
	scores = f.CastTo(scores, f.DType(), fn.Float32)
	scores = f.Where(mask, f.ScalarOf(fn.Float32, float32(math.Inf(-1))), scores)
	probs := f.CastTo(f.Softmax(scores, -1), fn.Float32, f.DType())
	ctx := f.Transpose(f.MatMul(probs, v), 1, 0, 2) // [N, nh, hd]
	return f.Reshape(ctx, 0, int64(c.hidden))
}

// geluTanh is GELU with the tanh approximation (gelu_pytorch_tanh), in
// the function's dtype.
func geluTanh(f *fn.Func, x fn.Value) fn.Value { return blocks.GELUTanh(f, x, f.DType()) }

// geluErf is exact GELU (nn.GELU()), in the function's dtype.
func geluErf(f *fn.Func, x fn.Value) fn.Value { return blocks.GELU(f, x, f.DType()) }
