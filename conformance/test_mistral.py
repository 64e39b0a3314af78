"""mistral (plugins/mistral) beyond the generic suite: a sliding window (4)
on every layer, shorter than the prompts (7 and 4), crossed by a chunked
prefill whose first chunk is longer than the window and by the decode
steps, whole, layerwise and with continuous batching (gpt-oss's tests,
test_gptoss.py, run on the mistral fixture); sliding_window null and
absent (MistralConfig's default 4096) as transformers reads them; one
layer function, reading the sliding mask only when there is a window; and
configs whose math the plugin does not implement refused by field name,
nothing written."""

import subprocess

import numpy as np
import onnx
import pytest

import test_gptoss as gptoss
from test_conformance import STRATA, TOLERANCE, Fixture, export, layer_count, max_diff_per_step

SLIDING = ["mistral-f32-sliding"]
NAMES = ["mistral-bf16-defaults-tied", "mistral-bf16-full", "mistral-f32-sliding"]


def test_fixtures_as_meant():
    """The sliding fixture's window is shorter than the longer prompt and
    as long as the shorter one; the full one says null; the defaults one
    names neither sliding_window nor num_key_value_heads."""
    for name in SLIDING:
        fx = Fixture(name)
        window = gptoss.config(fx)["sliding_window"]
        assert fx.ref["prompt_lengths"].max() > window and fx.ref["prompt_lengths"].min() == window
    cfg = gptoss.config(Fixture("mistral-bf16-full"))
    assert "sliding_window" in cfg and cfg["sliding_window"] is None
    assert cfg["head_dim"] != cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg = gptoss.config(Fixture("mistral-bf16-defaults-tied"))
    assert "sliding_window" not in cfg and "num_key_value_heads" not in cfg


@pytest.mark.parametrize("name", SLIDING)
def test_chunked_prefill_longer_than_the_window(name, tmp_path):
    """Chunks of window + 1, whole, and layerwise with layer functions,
    stitched and window by window (test_gptoss.py's test)."""
    gptoss.test_chunked_prefill_longer_than_the_window(name, tmp_path)


@pytest.mark.parametrize("name", SLIDING)
def test_continuous_batching_chunked(name, tmp_path):
    """Each prompt prefilled alone into its cache row in chunks of window + 1,
    then both decode together past the window (test_gptoss.py's test)."""
    gptoss.test_continuous_batching_chunked(name, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_float16_compute(name, tmp_path):
    """--dtype float16 within 2% of the logits' scale (test_gptoss.py's test)."""
    gptoss.test_float16_compute(name, tmp_path)


# The config edit, and whether the logits must then differ from the reference.
WINDOW_EDITS = {
    "mistral-f32-sliding": [("null", lambda c: c.update(sliding_window=None), True),
                            ("absent (4096)", lambda c: c.pop("sliding_window"), True),
                            ("8", lambda c: c.update(sliding_window=8), True),
                            ("layer_types all full", lambda c: c.update(layer_types=["full_attention"] * 3), False)],
    "mistral-bf16-full": [("4", lambda c: c.update(sliding_window=4), True),
                          ("absent (4096)", lambda c: c.pop("sliding_window"), False)],
}


@pytest.mark.parametrize("name", sorted(WINDOW_EDITS))
def test_window_matters(name, tmp_path):
    """The reference depends on the window as the plugin reads it: the same
    checkpoint with another sliding_window gives other logits (so the
    fixtures catch a mask not applied, or applied where null says none);
    absent is 4096, as good as full attention at these lengths; layer_types
    does not change MistralModel's math."""
    fx = Fixture(name)
    for i, (label, edit, differs) in enumerate(WINDOW_EDITS[name]):
        model, out = tmp_path / f"model-{i}", tmp_path / f"out-{i}"
        gptoss.rewrite(fx.model, model, edit)
        export(str(model), out)
        diff = max_diff_per_step(fx.run(str(out / "model.onnx")), fx.ref["logits"]).max()
        print(f"{name} sliding_window {label}: max |Δlogits| {diff:.2e}")
        assert diff > 1e-2 if differs else diff <= TOLERANCE, (label, diff)


@pytest.mark.parametrize("name", NAMES)
def test_one_layer_function(name, tmp_path):
    """--subfunctions: every layer calls MistralDecoderLayer, which reads
    the sliding mask when there is a window and the causal mask otherwise;
    no Range or Expand inside it; onnx's full check passes."""
    fx = Fixture(name)
    out = tmp_path / "out"
    export(fx.model, out, "--subfunctions", "--link", "copy")
    path = str(out / "model.onnx")
    onnx.checker.check_model(path, full_check=True)
    model = onnx.load(path, load_external_data=False)
    calls = [n for n in model.graph.node if n.domain.startswith("strata.")]
    assert [n.op_type for n in calls] == ["MistralDecoderLayer"] * layer_count(fx)
    layer = next(f for f in model.functions if f.name == "MistralDecoderLayer")
    assert not {n.op_type for n in layer.node} & {"Range", "Expand"}
    read = {i for n in layer.node for i in n.input}
    sliding = gptoss.config(fx).get("sliding_window", 4096) is not None
    assert ("sliding_mask" in read, "mask" in read) == (sliding, not sliding), sorted(read & {"mask", "sliding_mask"})
    np.testing.assert_allclose(fx.run(path), fx.ref["logits"], atol=TOLERANCE, rtol=0)


BAD = {
    "mixed layer_types": (lambda c: c.update(layer_types=["sliding_attention", "full_attention", "full_attention"]),
                          'layer_types mixes "sliding_attention" and "full_attention"'),
    "zero window": (lambda c: c.update(sliding_window=0), "sliding_window must be positive (or null for full attention), got 0"),
    "partial rotary": (lambda c: c.update(partial_rotary_factor=0.5), "partial_rotary_factor"),
    "per-layer overrides": (lambda c: c.update(per_layer_config={"1": {"sliding_window": 2}}), "per_layer_config"),
    "gelu": (lambda c: c.update(hidden_act="gelu"), 'hidden_act "gelu" is not supported by the mistral plugin'),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoints_are_refused(case, tmp_path):
    edit, want = BAD[case]
    model = tmp_path / "model"
    gptoss.rewrite(Fixture("mistral-f32-sliding").model, model, edit)
    out = tmp_path / "out"
    proc = subprocess.run([STRATA, "export", str(model), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode != 0 and want in proc.stderr, proc.stderr
    assert not (out / "model.onnx").exists()
