"""Qwen3-VL / Qwen3-VL-MoE (plugins/qwen3vl), text only, beyond the generic
suite (which runs every qwen3vl fixture with position_ids [batch, seq], the
default): position_ids [3, batch, seq] (--plugin-option position_ids_rank=3,
the three MRoPE rows, equal for text), whole, layerwise and with layer
functions; a 3-row input refused by a 2-row export and the reverse; chunked
prefill continuing the cache; both fused-expert orientations giving the same
logits; both MoE strategies."""

import json
import os

import numpy as np
import onnx
import pytest

import mrope
import ortrun
from test_conformance import FIXTURES, FIXTURES_DIR, TOLERANCE, Fixture, export, max_diff_per_step, window_files

QWEN3VL = [n for n in FIXTURES if n.startswith("qwen3vl")]
MOE = [n for n in QWEN3VL if n.startswith("qwen3vl-moe")]
RANK3 = ["--plugin-option", "position_ids_rank=3"]


class Rows3:
    """Any runner fed [3, batch, seq] position ids: each step's [batch, seq]
    positions repeated on the three rows (text: t = h = w)."""

    def __init__(self, sess):
        self.sess = sess

    def get_inputs(self):
        return self.sess.get_inputs()

    def step(self, input_ids, position_ids, caches):
        return ortrun.step(self.sess, input_ids, np.broadcast_to(position_ids, (3, *position_ids.shape)).copy(), caches)


def run(fx, runner):
    return ortrun.run_steps(runner, fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"],
                            fx.meta["ctx_len"])


@pytest.mark.parametrize("name", QWEN3VL)
def test_three_row_positions(name, tmp_path):
    """position_ids [3, batch, seq]: the graph input has 3 rows; whole,
    layerwise window 1 (stitched and window by window) and with layer
    functions, the logits are transformers'."""
    fx = Fixture(name)
    export(fx.model, tmp_path / "whole", *RANK3)
    path = str(tmp_path / "whole" / "model.onnx")
    sess = ortrun.session(path)
    pos = next(i for i in sess.get_inputs() if i.name == "position_ids")
    assert pos.shape == [3, "batch_size", "seq_len"], pos.shape
    diffs = {"whole": max_diff_per_step(run(fx, Rows3(sess)), fx.ref["logits"]).max()}
    lw = tmp_path / "layerwise"
    export(fx.model, lw, *RANK3, "--layerwise", "--window-size", "1", "--subfunctions", "--keep-windows")
    diffs["layerwise stitched"] = max_diff_per_step(run(fx, Rows3(ortrun.session(str(lw / "model.onnx")))),
                                                    fx.ref["logits"]).max()
    diffs["windows"] = max_diff_per_step(run(fx, Rows3(ortrun.Windows(window_files(lw)))), fx.ref["logits"]).max()
    sub = tmp_path / "sub"
    export(fx.model, sub, *RANK3, "--subfunctions", "--link", "copy")
    onnx.checker.check_model(str(sub / "model.onnx"), full_check=True)
    model = onnx.load(str(sub / "model.onnx"), load_external_data=False)
    for f in model.functions:
        if f.name in ("CtxGather", "CtxScatter", "CustomRMSNorm"):  # custom ops with reference bodies
            continue
        ops = {n.op_type for n in f.node}
        assert "Range" not in ops and "Expand" not in ops, f"{f.name}: {ops & {'Range', 'Expand'}}"
        if f.name.endswith("DecoderLayer"):
            assert "position_ids" not in f.input and "positions" in f.input, list(f.input)
    diffs["subfunctions"] = max_diff_per_step(run(fx, Rows3(ortrun.session(str(sub / "model.onnx")))),
                                              fx.ref["logits"]).max()
    print(f"{name} position_ids [3, batch, seq]: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_position_rows_must_match_the_export(tmp_path):
    """A 3-row position input to an export that declared 2 rows (and the
    reverse) is refused by ONNX Runtime's shape check, not run."""
    fx = Fixture("qwen3vl-f32-dense")
    export(fx.model, tmp_path / "r2")
    export(fx.model, tmp_path / "r3", *RANK3)
    prompts, lengths = fx.ref["prompts"], fx.ref["prompt_lengths"]
    pos = ortrun.prefill_positions(lengths, prompts.shape[1])
    for rank, feed in (("r2", np.stack([pos] * 3)), ("r3", pos)):
        sess = ortrun.session(str(tmp_path / rank / "model.onnx"))
        caches = ortrun.empty_caches(sess, prompts.shape[0], fx.meta["ctx_len"])
        with pytest.raises(Exception, match="(?i)rank|dimension|shape"):
            ortrun.step(sess, prompts, feed, caches)


@pytest.mark.parametrize("rank", [2, 3])
@pytest.mark.parametrize("name", ["qwen3vl-f32-dense", "qwen3vl-moe-bf16-hub-sparse"])
def test_chunked_prefill(name, rank, tmp_path):
    """A prompt fed in two chunks (the second continuing the cache the
    first wrote, rows padded to the longest remainder) gives transformers'
    prefill logits, and decoding then continues as transformers does."""
    fx = Fixture(name)
    export(fx.model, tmp_path / "out", *(RANK3 if rank == 3 else []))
    sess = ortrun.session(str(tmp_path / "out" / "model.onnx"))
    runner = Rows3(sess) if rank == 3 else sess
    prompts, lengths, tokens = fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"]
    batch, first = prompts.shape[0], 3
    assert lengths.min() > first
    caches = ortrun.empty_caches(sess, batch, fx.meta["ctx_len"])
    _, caches = ortrun.step(runner, prompts[:, :first], np.tile(np.arange(first, dtype=np.int64), (batch, 1)), caches)
    width = prompts.shape[1] - first
    ar = np.arange(first, first + width, dtype=np.int64)[None, :]
    pos = np.where(ar < lengths[:, None], ar, -1).astype(np.int64)
    logits, caches = ortrun.step(runner, prompts[:, first:], pos, caches)
    got = [logits[:, 0, :]]
    for s in range(tokens.shape[1]):
        logits, caches = ortrun.step(runner, tokens[:, s : s + 1].astype(np.int64),
                                     (lengths + s)[:, None].astype(np.int64), caches)
        got.append(logits[:, 0, :])
    diffs = max_diff_per_step(np.stack(got), fx.ref["logits"])
    print(f"{name} rank {rank} chunked prefill: max |Δlogits| {diffs.max():.2e}")
    assert diffs.max() <= TOLERANCE, diffs


def test_expert_orientations_agree(tmp_path):
    """The same weights with the experts in transformers' orientation
    ([E, 2I, H], [E, H, I]) and in the Hub's ([E, H, 2I], [E, I, H]) give
    the same logits."""
    a, b = Fixture("qwen3vl-moe-f32-mixed"), Fixture("qwen3vl-moe-f32-hub")
    export(a.model, tmp_path / "a")
    export(b.model, tmp_path / "b")
    la, lb = a.run(str(tmp_path / "a" / "model.onnx")), b.run(str(tmp_path / "b" / "model.onnx"))
    assert np.abs(la - lb).max() <= 1e-6


@pytest.mark.parametrize("name", MOE)
def test_moe_strategies(name, tmp_path):
    """--moe-strategy gather and dense both reproduce transformers, whole and
    layerwise with layer functions."""
    fx = Fixture(name)
    for strategy in ("gather", "dense"):
        out = tmp_path / strategy
        export(fx.model, out, "--moe-strategy", strategy, "--layerwise", "--window-size", "2", "--subfunctions",
               "--keep-windows")
        stitched = max_diff_per_step(fx.run(str(out / "model.onnx")), fx.ref["logits"]).max()
        windows = max_diff_per_step(run(fx, ortrun.Windows(window_files(out))), fx.ref["logits"]).max()
        print(f"{name} {strategy}: stitched {stitched:.2e}, windows {windows:.2e}")
        assert max(stitched, windows) <= TOLERANCE


def test_tied_head_reads_the_top_level_flag(tmp_path):
    """tie_word_embeddings is read from the top level (transformers' choice);
    the tied fixture has no lm_head.weight and the export binds the
    embedding as the head."""
    fx = Fixture("qwen3vl-bf16-dense-tied")
    spec = export(fx.model, tmp_path / "out")
    keys = {s["key"] for w in spec["weights"] for s in w["sources"]}
    assert "lm_head.weight" not in keys and "model.language_model.embed_tokens.weight" in keys
    assert not any(k.startswith("model.visual.") for k in keys)


# The vision encoder, vision.onnx (--extra-model vision), against
# transformers' get_image_features on the fixture's two images (grids
# vision.npz holds; the second has two frames).
def vision_session(fx, tmp_path, *args):
    out = tmp_path / "vision"
    export(fx.model, out, "--extra-model", "vision", *args)
    return ortrun.session(str(out / "vision.onnx")), out


def image_features(sess, pixels, grid):
    return sess.run(["vision_embeds", "deepstack_features"], {"pixel_values": pixels, "image_grid_thw": grid})


def vision_outputs(sess, pixels, grid):
    """Every output of vision.onnx by name (Qwen3.5's has no deepstack_features)."""
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {"pixel_values": pixels, "image_grid_thw": grid})))


@pytest.mark.parametrize("name", QWEN3VL)
def test_vision_matches_get_image_features(name, tmp_path):
    """Merged embeddings and DeepStack features of both images at once,
    and of each image alone (any number of images, any grid: the grid
    arithmetic is in the graph)."""
    fx = Fixture(name)
    ref = np.load(os.path.join(fx.dir, "vision.npz"))
    sess, out = vision_session(fx, tmp_path)
    assert [i.name for i in sess.get_inputs()] == ["pixel_values", "image_grid_thw"]
    embeds, deep = image_features(sess, ref["pixel_values"], ref["image_grid_thw"])
    diffs = [np.abs(embeds - ref["vision_embeds"]).max(), np.abs(deep - ref["deepstack_features"]).max()]
    grid = ref["image_grid_thw"]
    patches = np.cumsum([0] + [int(np.prod(g)) for g in grid])
    tokens = patches // 4  # spatial_merge_size 2
    for i in range(len(grid)):
        e, d = image_features(sess, ref["pixel_values"][patches[i] : patches[i + 1]], grid[i : i + 1])
        diffs += [np.abs(e - ref["vision_embeds"][tokens[i] : tokens[i + 1]]).max(),
                  np.abs(d - ref["deepstack_features"][:, tokens[i] : tokens[i + 1]]).max()]
    print(f"{name} vision: max |Δ| embeds {diffs[0]:.2e}, deepstack {diffs[1]:.2e}, images alone {max(diffs[2:]):.2e}")
    assert max(diffs) <= TOLERANCE, diffs
    keys = {s["key"] for w in json.load(open(out / "weight_spec.json"))["weights"] for s in w["sources"]}
    assert any(k.startswith(("model.visual.", "visual.")) for k in keys)  # the layouts transformers loads


def test_vision_refuses_inputs_the_grid_does_not_describe(tmp_path):
    """More or fewer patches than the grids say, or a grid not a multiple of
    spatial_merge_size: ONNX Runtime fails, nothing is computed."""
    fx = Fixture("qwen3vl-f32-dense")
    ref = np.load(os.path.join(fx.dir, "vision.npz"))
    sess, _ = vision_session(fx, tmp_path)
    px, grid = ref["pixel_values"], ref["image_grid_thw"]
    for pixels, g in [(px[:-4], grid), (np.concatenate([px, px[:4]]), grid), (px[:12], np.array([[1, 3, 4]]))]:
        with pytest.raises(Exception, match="Gather"):
            image_features(sess, pixels, g)


def test_vision_onnx_full_check(tmp_path):
    fx = Fixture("qwen3vl-moe-bf16-hub-sparse")
    _, out = vision_session(fx, tmp_path, "--link", "copy")
    onnx.checker.check_model(str(out / "vision.onnx"), full_check=True)


# model.onnx with vision inputs (--vision true) against transformers'
# Qwen3VL(Moe)ForConditionalGeneration given pixel_values: the fixtures'
# vision_prompts.npz batch of two prompts with three images (one image
# spans two frames), fed strata's own vision.onnx outputs for them, with
# position_ids from conformance/mrope.py.
VISION = [n for n in QWEN3VL if os.path.exists(os.path.join(FIXTURES_DIR, n, "vision_prompts.npz"))]
VISION_ARGS = ["--vision", "true", "--extra-model", "vision"]


class VisionPrompts:
    def __init__(self, name):
        self.fx = Fixture(name)
        self.ref = np.load(os.path.join(self.fx.dir, "vision_prompts.npz"))
        top = json.load(open(os.path.join(self.fx.model, "config.json")))
        self.image_token = top["image_token_id"]
        self.merge = top["vision_config"]["spatial_merge_size"]
        self.ctx_len = self.fx.meta["ctx_len"]

    def positions(self):
        return mrope.prefill(self.ref["prompts"], self.ref["prompt_lengths"], self.ref["image_grid_thw"],
                             self.image_token, self.merge)

    def export(self, out, *args):
        export(self.fx.model, out, *VISION_ARGS, *args)
        sess = ortrun.session(str(out / "vision.onnx"))
        return vision_outputs(sess, self.ref["pixel_values"], self.ref["image_grid_thw"])


def no_rows(rows):
    """The vision inputs of a step without image tokens: 0 rows."""
    return {k: v[..., :0, :] for k, v in rows.items()}


def vision_run(vp, runner, rows):
    """Logits [1 + steps, batch, vocab]: a padded prefill with the images'
    rows, then decode steps with 0 rows."""
    ref = vp.ref
    pos, deltas = vp.positions()
    prompts, lengths, tokens = ref["prompts"], ref["prompt_lengths"], ref["decode_tokens"]
    caches = ortrun.empty_caches(runner, prompts.shape[0], vp.ctx_len)
    logits, caches = ortrun.step(runner, prompts, pos, caches, rows)
    out = [logits[:, 0, :]]
    for s in range(tokens.shape[1]):
        step_pos = mrope.decode((lengths + s)[:, None], deltas)
        logits, caches = ortrun.step(runner, tokens[:, s : s + 1].astype(np.int64), step_pos, caches, no_rows(rows))
        out.append(logits[:, 0, :])
    return np.stack(out)


@pytest.mark.parametrize("name", VISION)
def test_mrope_helper_matches_get_rope_index(name):
    """conformance/mrope.py's rows 1..3 are get_rope_index's at every valid
    position, its deltas transformers' rope deltas; row 0 is the sequence
    position, −1 for padding."""
    vp = VisionPrompts(name)
    pos, deltas = vp.positions()
    lengths = vp.ref["prompt_lengths"]
    valid = np.arange(pos.shape[2])[None, :] < lengths[:, None]
    assert np.array_equal(pos[1:][:, valid], vp.ref["rope_position_ids"][:, valid])
    assert np.array_equal(deltas, vp.ref["rope_deltas"]) and deltas.min() < 0  # the images shorten the rows
    assert np.array_equal(pos[0], ortrun.prefill_positions(lengths, pos.shape[2]))
    assert np.all(pos[:, ~valid] == -1)
    step = mrope.decode(np.array([[5], [-1]]), np.array([-2, 3]))
    assert step[:, :, 0].tolist() == [[5, -1], [3, -1], [3, -1], [3, -1]]


@pytest.mark.parametrize("mode", ["whole", "layerwise", "subfunctions"])
@pytest.mark.parametrize("name", VISION)
def test_vision_inputs_match_transformers(name, mode, tmp_path):
    """Prefill with images then decode: whole, layerwise window 1 (stitched
    and window by window) and with layer functions, the logits are
    transformers' with pixel_values."""
    vp = VisionPrompts(name)
    args = {"whole": [], "layerwise": ["--layerwise", "--window-size", "1", "--keep-windows"],
            "subfunctions": ["--subfunctions"]}[mode]
    rows = vp.export(tmp_path, *args)
    sess = ortrun.session(str(tmp_path / "model.onnx"))
    inputs = {i.name: i.shape for i in sess.get_inputs()}
    assert inputs["position_ids"] == [4, "batch_size", "seq_len"]
    assert inputs["vision_embeds"] == ["num_vision_tokens", rows["vision_embeds"].shape[1]]
    if "deepstack_features" in rows:  # Qwen3-VL; Qwen3.5 (test_qwen35_vision.py) has none
        assert inputs["deepstack_features"][0] == rows["deepstack_features"].shape[0]
    else:
        assert "deepstack_features" not in inputs, list(inputs)
    diffs = {mode: max_diff_per_step(vision_run(vp, sess, rows), vp.ref["logits"]).max()}
    if mode == "whole":  # the fixture tells each input: without it the logits are far off
        for k in rows:
            off = max_diff_per_step(vision_run(vp, sess, {**rows, k: np.zeros_like(rows[k])}), vp.ref["logits"]).max()
            assert off > 100 * TOLERANCE, f"zero {k}: {off:.2e}"
    if mode == "layerwise":
        diffs["windows"] = max_diff_per_step(vision_run(vp, ortrun.Windows(window_files(tmp_path)), rows),
                                             vp.ref["logits"]).max()
    if mode == "subfunctions":
        model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
        deep = [f.name for f in model.functions if "Deepstack" in f.name]
        want = rows["deepstack_features"].shape[0] if "deepstack_features" in rows else 0
        assert len(deep) == want, deep  # one function per DeepStack layer
    print(f"{name} vision inputs {mode}: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.parametrize("name", VISION)
def test_vision_chunked_prefill(name, tmp_path):
    """The prompts in two chunks, the first image's tokens split between
    them: each chunk gets the rows of its own image tokens (row-major over
    the chunk), and the logits are transformers'."""
    vp = VisionPrompts(name)
    rows = vp.export(tmp_path)
    sess = ortrun.session(str(tmp_path / "model.onnx"))
    ref = vp.ref
    prompts, lengths, tokens = ref["prompts"], ref["prompt_lengths"], ref["decode_tokens"]
    pos, deltas = vp.positions()
    image = prompts == vp.image_token
    first = int(np.argmax(image[0])) + 2  # two of the first image's tokens in the first chunk
    assert image[0, first - 1] and image[0, first]
    row_of = np.full(prompts.shape, -1)
    row_of[image] = np.arange(image.sum())  # row-major over the whole batch
    caches = ortrun.empty_caches(sess, prompts.shape[0], vp.ctx_len)
    for cols in (slice(0, first), slice(first, None)):
        idx = row_of[:, cols][image[:, cols]]
        chunk = {k: v[..., idx, :] for k, v in rows.items()}
        logits, caches = ortrun.step(sess, prompts[:, cols], pos[:, :, cols], caches, chunk)
    got = [logits[:, 0, :]]
    for s in range(tokens.shape[1]):
        logits, caches = ortrun.step(sess, tokens[:, s : s + 1].astype(np.int64),
                                     mrope.decode((lengths + s)[:, None], deltas), caches, no_rows(rows))
        got.append(logits[:, 0, :])
    diffs = max_diff_per_step(np.stack(got), ref["logits"])
    print(f"{name} vision chunked prefill: max |Δlogits| {diffs.max():.2e}")
    assert diffs.max() <= TOLERANCE, diffs


def test_vision_rows_must_number_the_image_tokens(tmp_path):
    """One row too few or too many, in either input, or rows for a step
    without image tokens: ONNX Runtime fails the run (the rows are reshaped
    to the image-token count), nothing is computed from short rows."""
    vp = VisionPrompts(VISION[0])
    rows = vp.export(tmp_path)
    sess = ortrun.session(str(tmp_path / "model.onnx"))
    pos, _ = vp.positions()
    prompts = vp.ref["prompts"]
    embeds, deep = rows["vision_embeds"], rows["deepstack_features"]
    bad = [{"vision_embeds": embeds[:-1], "deepstack_features": deep},
           {"vision_embeds": np.concatenate([embeds, embeds[:1]]), "deepstack_features": deep},
           {"vision_embeds": embeds, "deepstack_features": deep[:, 1:]},
           no_rows(rows)]
    for feed in bad:
        caches = ortrun.empty_caches(sess, prompts.shape[0], vp.ctx_len)
        with pytest.raises(Exception, match="(?i)reshape"):
            ortrun.step(sess, prompts, pos, caches, feed)
    text = vp.fx.ref["prompts"]  # text only, no image token
    caches = ortrun.empty_caches(sess, text.shape[0], vp.ctx_len)
    with pytest.raises(Exception, match="(?i)reshape"):
        ortrun.step(sess, text, np.stack([ortrun.prefill_positions(vp.fx.ref["prompt_lengths"], text.shape[1])] * 4),
                    caches, {k: v[..., :1, :] for k, v in rows.items()})


@pytest.mark.parametrize("name", VISION)
def test_vision_export_runs_text_only(name, tmp_path):
    """Text-only prompts through the vision export, 0 rows on every step and
    the four rows all the sequence position: transformers' text-only
    logits."""
    vp = VisionPrompts(name)
    rows = no_rows(vp.export(tmp_path))
    sess = ortrun.session(str(tmp_path / "model.onnx"))
    ref = vp.fx.ref
    prompts, lengths, tokens = ref["prompts"], ref["prompt_lengths"], ref["decode_tokens"]
    assert not np.any(prompts == vp.image_token)
    four = lambda p: np.stack([p] * 4)
    caches = ortrun.empty_caches(sess, prompts.shape[0], vp.ctx_len)
    logits, caches = ortrun.step(sess, prompts, four(ortrun.prefill_positions(lengths, prompts.shape[1])), caches, rows)
    got = [logits[:, 0, :]]
    for s in range(tokens.shape[1]):
        logits, caches = ortrun.step(sess, tokens[:, s : s + 1].astype(np.int64),
                                     four((lengths + s)[:, None].astype(np.int64)), caches, rows)
        got.append(logits[:, 0, :])
    diffs = max_diff_per_step(np.stack(got), ref["logits"])
    print(f"{name} vision export, text only: max |Δlogits| {diffs.max():.2e}")
    assert diffs.max() <= TOLERANCE, diffs
