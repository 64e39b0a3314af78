"""The serving modes the generic suite does not run on every fixture —
a chunked prefill (each chunk continuing the cache; chunks of 3, and of
window + 1 where there is a sliding window) and --dtype float16 — for the
plugins added on the SDK's variation points (olmo2, phi3, gemma3, qwen35, deepseek;
mistral runs them in test_mistral.py; test_qwen35.py runs more for the
linear-attention states). test_gptoss.py's helpers, not copies."""

import json
import os

import numpy as np
import pytest

import ortrun
import test_gptoss as gptoss
from test_conformance import FIXTURES, TOLERANCE, Fixture, export, max_diff_per_step

NAMES = [n for n in FIXTURES if n.startswith(("olmo2-", "phi3-", "gemma3-", "qwen35-", "qwen35moe-", "qwen3next-", "deepseek-", "glm4lite-"))]


def chunk_sizes(fx):
    """3, and window + 1 when the config has a sliding window. With longrope
    every chunk passes original_max_position_embeddings: transformers picks
    the long or short table per call, so a first chunk below the threshold
    caches keys the unchunked reference rotates otherwise (the plugin says
    so; transformers' generate() re-prefills there)."""
    with open(os.path.join(fx.model, "config.json")) as f:
        cfg = json.load(f)
    sizes = {3}
    if cfg.get("sliding_window"):
        sizes.add(cfg["sliding_window"] + 1)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if rope.get("rope_type") == "longrope":
        least = int(cfg.get("original_max_position_embeddings", 4096)) + 1
        sizes = {max(s, least) for s in sizes}
    return sorted(sizes)


def test_every_new_plugin_has_fixtures():
    assert {n.split("-")[0] for n in NAMES} == {"olmo2", "phi3", "gemma3", "qwen35", "qwen35moe", "qwen3next", "deepseek", "glm4lite"}


@pytest.mark.parametrize("name", NAMES)
def test_chunked_prefill(name, tmp_path):
    """Whole, and layerwise with layer functions: each chunk reads the keys
    the earlier ones wrote."""
    fx = Fixture(name)
    export(fx.model, tmp_path / "whole")
    export(fx.model, tmp_path / "lw", "--layerwise", "--window-size", "1", "--subfunctions")
    report = {}
    for label in ("whole", "lw"):
        sess = ortrun.session(str(tmp_path / label / "model.onnx"))
        for chunk in chunk_sizes(fx):
            report[f"{label} {chunk}"] = max_diff_per_step(gptoss.run_chunked(sess, fx, chunk), fx.ref["logits"]).max()
    print(f"{name} chunked prefill: " + ", ".join(f"{k} {v:.2e}" for k, v in report.items()))
    assert max(report.values()) <= TOLERANCE, report


@pytest.mark.parametrize("name", NAMES)
def test_float16_compute(name, tmp_path):
    """--dtype float16 within 2% of the logits' scale (float32 is what the
    fixtures pin; float16 rounds norms and activations on the way)."""
    fx = Fixture(name)
    export(fx.model, tmp_path / "out", "--dtype", "float16")
    diffs = max_diff_per_step(fx.run(str(tmp_path / "out" / "model.onnx")), fx.ref["logits"])
    scale = np.abs(fx.ref["logits"]).max()
    print(f"{name} float16: max |Δlogits| {diffs.max():.3e} of scale {scale:.2f}")
    assert diffs.max() <= 0.02 * scale
