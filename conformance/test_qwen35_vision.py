"""Qwen3.5's vision (plugins/qwen35, the natively multimodal qwen3_5 and
qwen3_5_moe), through the vision mechanism Qwen3-VL has (the SDK's Qwen
vision encoder and vision inputs): vision.onnx (--extra-model vision)
against transformers' get_image_features, and model.onnx with vision inputs
(--vision true) against transformers' Qwen3_5(Moe)ForConditionalGeneration
given pixel_values, whole, layerwise and with layer functions, chunked
prefill (the DeltaNet states carried across the chunk that splits an
image), slot reuse with continuous batching, text only. What differs from
Qwen3-VL: no DeepStack (vision.onnx outputs vision_embeds only, model.onnx
takes no deepstack_features), and the MRoPE of the partial rotary width
with its own default sections. Most bodies are test_qwen3vl.py's, which
hold for both."""

import os

import numpy as np
import pytest

import mrope
import ortrun
import test_qwen3vl as qvl
from test_conformance import FIXTURES, FIXTURES_DIR, TOLERANCE, Fixture

VISION = [n for n in FIXTURES if n.startswith(("qwen35-", "qwen35moe-"))
          and os.path.exists(os.path.join(FIXTURES_DIR, n, "vision_prompts.npz"))]


def test_dense_and_moe_have_vision_fixtures():
    assert {n.split("-")[0] for n in VISION} == {"qwen35", "qwen35moe"}


@pytest.mark.parametrize("name", VISION)
def test_vision_matches_get_image_features(name, tmp_path):
    """vision_embeds of both images at once and of each alone; vision.onnx
    has no DeepStack output."""
    fx = Fixture(name)
    ref = np.load(os.path.join(fx.dir, "vision.npz"))
    assert "deepstack_features" not in ref
    sess, _ = qvl.vision_session(fx, tmp_path)
    assert [o.name for o in sess.get_outputs()] == ["vision_embeds"]
    px, grid = ref["pixel_values"], ref["image_grid_thw"]
    diffs = [np.abs(qvl.vision_outputs(sess, px, grid)["vision_embeds"] - ref["vision_embeds"]).max()]
    patches = np.cumsum([0] + [int(np.prod(g)) for g in grid])
    tokens = patches // 4  # spatial_merge_size 2
    for i in range(len(grid)):
        e = qvl.vision_outputs(sess, px[patches[i] : patches[i + 1]], grid[i : i + 1])["vision_embeds"]
        diffs.append(np.abs(e - ref["vision_embeds"][tokens[i] : tokens[i + 1]]).max())
    print(f"{name} vision: max |Δ| embeds {diffs[0]:.2e}, images alone {max(diffs[1:]):.2e}")
    assert max(diffs) <= TOLERANCE, diffs


@pytest.mark.parametrize("name", VISION)
def test_mrope_helper_matches_get_rope_index(name):
    """Qwen3.5's get_rope_index is Qwen3-VL's: conformance/mrope.py gives it."""
    qvl.test_mrope_helper_matches_get_rope_index(name)


@pytest.mark.parametrize("mode", ["whole", "layerwise", "subfunctions"])
@pytest.mark.parametrize("name", VISION)
def test_vision_inputs_match_transformers(name, mode, tmp_path):
    qvl.test_vision_inputs_match_transformers(name, mode, tmp_path)


@pytest.mark.parametrize("name", VISION)
def test_vision_chunked_prefill(name, tmp_path):
    qvl.test_vision_chunked_prefill(name, tmp_path)


@pytest.mark.parametrize("name", VISION)
def test_vision_export_runs_text_only(name, tmp_path):
    qvl.test_vision_export_runs_text_only(name, tmp_path)


def test_vision_rows_must_number_the_image_tokens(tmp_path):
    """Too few or too many vision rows, or rows for a step without image
    tokens: ONNX Runtime fails the run."""
    vp = qvl.VisionPrompts(VISION[0])
    rows = vp.export(tmp_path)
    sess = ortrun.session(str(tmp_path / "model.onnx"))
    pos, _ = vp.positions()
    prompts, embeds = vp.ref["prompts"], rows["vision_embeds"]
    for feed in ({"vision_embeds": embeds[:-1]}, {"vision_embeds": np.concatenate([embeds, embeds[:1]])},
                 qvl.no_rows(rows)):
        caches = ortrun.empty_caches(sess, prompts.shape[0], vp.ctx_len)
        with pytest.raises(Exception, match="(?i)reshape"):
            ortrun.step(sess, prompts, pos, caches, feed)


@pytest.mark.parametrize("name", VISION)
def test_vision_slot_reuse_starts_fresh(name, tmp_path):
    """With continuous batching, slot 1 serves sequence 0 (with its image),
    then sequence 1 (two images): its row 0 starts at 0, so its DeltaNet
    states start from zero, whatever the slot held; slot 2 serves sequence 0
    again. Each gives transformers' logits with pixel_values."""
    vp = qvl.VisionPrompts(name)
    rows = vp.export(tmp_path, "--continuous-batching")["vision_embeds"]
    sess = ortrun.session(str(tmp_path / "model.onnx"))
    ref = vp.ref
    prompts, lengths, tokens = ref["prompts"], ref["prompt_lengths"], ref["decode_tokens"]
    pos, deltas = vp.positions()
    image = prompts == vp.image_token
    row_of = np.full(prompts.shape, -1)
    row_of[image] = np.arange(image.sum())  # row-major over the batch, as vision.onnx's rows
    caches = ortrun.empty_caches(sess, 3, vp.ctx_len)
    empty = rows[:0]

    def step(ids, position_ids, slot, embeds):
        feeds = {"input_ids": ids, "position_ids": position_ids, "batch_index": np.array([[slot]], dtype=np.int64),
                 "vision_embeds": embeds, **caches}
        names = [o.name for o in sess.get_outputs()]
        outs = dict(zip(names, sess.run(names, feeds)))
        caches.update({k[: -len("_RetainedState")]: v for k, v in outs.items() if k.endswith("_RetainedState")})
        return outs["logits"][0, 0]

    def sequence(b, slot):
        n = int(lengths[b])
        got = [step(prompts[b : b + 1, :n], pos[:, b : b + 1, :n], slot, rows[row_of[b, :n][image[b, :n]]])]
        for s in range(tokens.shape[1]):
            step_pos = mrope.decode(np.array([[n + s]]), deltas[b : b + 1])
            got.append(step(tokens[b : b + 1, s : s + 1].astype(np.int64), step_pos, slot, empty))
        return np.abs(np.stack(got) - ref["logits"][:, b]).max()

    diffs = {"seq 0 in slot 1": sequence(0, 1), "seq 1 reusing slot 1": sequence(1, 1), "seq 0 in slot 2": sequence(0, 2)}
    print(f"{name} vision slot reuse: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert max(diffs.values()) <= TOLERANCE, diffs
