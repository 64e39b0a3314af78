"""Qwen3.5's vision (plugins/qwen35, the natively multimodal qwen3_5 and
qwen3_5_moe), through the vision mechanism Qwen3-VL has (the SDK's Qwen
vision encoder and vision inputs): vision.onnx (--extra-model vision)
against transformers' get_image_features, and model.onnx with vision inputs
(--vision true) against transformers' Qwen3_5(Moe)ForConditionalGeneration
given pixel_values, whole, layerwise and with layer functions, chunked
prefill (the DeltaNet states carried across the chunk that splits an
image), text only. What differs from Qwen3-VL: no DeepStack (vision.onnx
outputs vision_embeds only, model.onnx takes no deepstack_features), and
the MRoPE of the partial rotary width with its own default sections. The
bodies are test_qwen3vl.py's, which hold for both."""

import os

import numpy as np
import pytest

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
