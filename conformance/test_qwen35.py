"""The hybrid linear-attention models (plugins/qwen35): what holds for their
states, not only for positions. Chunked prefill carries conv_state and
recurrent_state across calls (chunks of 3 and 5: shorter and longer than
the conv kernel 4; rows whose chunk is all padding keep their states);
continuous batching reuses a slot for a new sequence (its first position 0
starts from zero state, whatever the slot held) and a padding row leaves
its slot untouched; a call longer than the delta rule's parallel form was
built for gives NaN, not a wrong number. Whole, layerwise with layer
functions stitched, and window by window. (The generic suite runs these
fixtures in every other mode; test_plugin_modes.py in float16.)"""

import json
import os
import subprocess

import numpy as np
import onnx
import pytest

import ortrun
import test_glm as glm
import test_gptoss as gptoss
from test_conformance import (FIXTURES, STRATA, TOLERANCE, Fixture, export, max_diff_per_step, read_safetensors,
                              safetensors_header, window_files)

NAMES = [n for n in FIXTURES if n.startswith(("qwen35-", "qwen35moe-", "qwen3next-"))]
FULL_BATCH = 3


def test_every_family_has_fixtures():
    assert {n.split("-")[0] for n in NAMES} == {"qwen35", "qwen35moe", "qwen3next"}
    assert {Fixture(n).meta["checkpoint_dtype"] for n in NAMES} == {"float32", "bfloat16"}


def runs(fx, tmp_path, *args):
    export(fx.model, tmp_path / "whole", *args)
    export(fx.model, tmp_path / "lw", "--layerwise", "--window-size", "1", "--subfunctions", "--keep-windows", *args)
    return {"whole": ortrun.session(str(tmp_path / "whole" / "model.onnx")),
            "layerwise": ortrun.session(str(tmp_path / "lw" / "model.onnx")),
            "windows": ortrun.Windows(window_files(tmp_path / "lw"))}


@pytest.mark.parametrize("name", NAMES)
def test_chunked_prefill_carries_state(name, tmp_path):
    fx = Fixture(name)
    report = {}
    for label, sess in runs(fx, tmp_path).items():
        for chunk in (3, 5):
            report[f"{label} {chunk}"] = max_diff_per_step(gptoss.run_chunked(sess, fx, chunk), fx.ref["logits"]).max()
    print(f"{name} chunked prefill: " + ", ".join(f"{k} {v:.2e}" for k, v in report.items()))
    assert max(report.values()) <= TOLERANCE, report


class Slots:
    """A continuous-batching session over FULL_BATCH slots of state."""

    def __init__(self, sess, ctx_len):
        self.sess = sess
        self.caches = ortrun.empty_caches(sess, FULL_BATCH, ctx_len)

    def step(self, ids, pos, slots):
        ids, pos = np.asarray(ids, dtype=np.int64), np.asarray(pos, dtype=np.int64)
        extra = {"batch_index": np.asarray(slots, dtype=np.int64)[:, None]}
        if hasattr(self.sess, "sessions"):  # Windows: batch_index goes to every window
            logits, retained = self.sess.step(ids, pos, self.caches, extra=extra)
        else:
            names = [o.name for o in self.sess.get_outputs()]
            outs = dict(zip(names, self.sess.run(names, {"input_ids": ids, "position_ids": pos, **self.caches, **extra})))
            logits = outs["logits"]
            retained = {k[: -len("_RetainedState")]: v for k, v in outs.items() if k.endswith("_RetainedState")}
        self.caches.update(retained)
        return logits[:, 0]

    def sequence(self, fx, b, slot, pad_after=None):
        """Sequence b alone in slot: prefill, then its decode steps; with
        pad_after, a padding-only call for the slot after that decode step."""
        n = int(fx.ref["prompt_lengths"][b])
        got = [self.step(fx.ref["prompts"][b:b + 1, :n], np.arange(n)[None, :], [slot])[0]]
        for s, tok in enumerate(fx.ref["decode_tokens"][b]):
            if s == pad_after:
                self.step([[0]], [[-1]], [slot])
            got.append(self.step([[tok]], [[n + s]], [slot])[0])
        return np.stack(got)


@pytest.mark.parametrize("name", NAMES)
def test_slot_reuse_starts_fresh(name, tmp_path):
    """Slot 1 serves sequence 0, then sequence 1 (starting at position 0, so
    from zero state although the slot holds sequence 0's); a padding-only
    call in the middle of sequence 1 changes nothing; slot 2, never
    written, serves sequence 0 again, with the same logits."""
    fx = Fixture(name)
    report = {}
    for label, sess in runs(fx, tmp_path, "--continuous-batching").items():
        slots = Slots(sess, fx.meta["ctx_len"])
        first = slots.sequence(fx, 0, 1)
        reused = slots.sequence(fx, 1, 1, pad_after=2)
        again = slots.sequence(fx, 0, 2)
        report[label] = max(np.abs(first - fx.ref["logits"][:, 0]).max(), np.abs(reused - fx.ref["logits"][:, 1]).max(),
                            np.abs(again - fx.ref["logits"][:, 0]).max())
    print(f"{name} slot reuse: " + ", ".join(f"{k} {v:.2e}" for k, v in report.items()))
    assert max(report.values()) <= TOLERANCE, report


def test_a_call_too_long_for_the_parallel_form_is_nan(tmp_path):
    """With delta_rule_max_seq_len 16, a 16-token call is exact and a
    17-token one gives NaN logits: refused at run time, not approximated."""
    fx = Fixture(NAMES[0])
    export(fx.model, tmp_path / "out", "--plugin-option", "delta_rule_max_seq_len=16")
    sess = ortrun.session(str(tmp_path / "out" / "model.onnx"))
    for n, nan in ((16, False), (17, True)):
        ids = (np.arange(n, dtype=np.int64) % 100 + 3)[None, :]
        caches = ortrun.empty_caches(sess, 1, fx.meta["ctx_len"])
        logits, _ = ortrun.step(sess, ids, np.arange(n, dtype=np.int64)[None, :], caches)
        assert np.isnan(logits).all() == nan and (nan or np.isfinite(logits).all()), n


# The MTP draft (plugins/qwen35/mtp.go): the mtp.* layer run as vLLM's
# Qwen3NextMultiTokenPredictor / Qwen3_5MultiTokenPredictor, against a
# reference composed from transformers' modules (gen_qwen35.py: the model's
# decoder layer built as a full-attention layer with its own cache, its
# (1 + w) RMSNorms, nn.Linear for fc, the main model's embedding and head).
MTP_NAMES = [n for n in NAMES if n.endswith("-mtp")]


def test_mtp_fixtures_cover_moe_dense_and_both_count_fields():
    cfgs = {n: glm.config(Fixture(n)) for n in MTP_NAMES}
    assert {"num_nextn_predict_layers" in c for c in cfgs.values()} == {True, False}
    assert any(c.get("tie_word_embeddings") for c in cfgs.values())
    assert {Fixture(n).meta["checkpoint_dtype"] for n in MTP_NAMES} == {"float32", "bfloat16"}


@pytest.mark.parametrize("mode", ["whole", "layerwise-subfunctions"])
@pytest.mark.parametrize("name", MTP_NAMES)
def test_mtp_draft_matches_reference(name, mode, tmp_path):
    """--mtp draft: model.onnx's hidden_states and mtp.onnx's logits, prefill
    and decode, match the reference (test_glm.check_draft); no mtp.* weight
    in model.onnx; mtp.onnx reads the main embedding and head."""
    fx = Fixture(name)
    out = tmp_path / "out"
    export(fx.model, out, *glm.mtp_args(mode))
    glm.check_draft(fx, out, mode)
    main = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert not [i.name for i in main.graph.initializer if i.name.startswith("mtp.")]
    own = {i.name.split("::")[0] for i in onnx.load(str(out / "mtp.onnx"), load_external_data=False).graph.initializer}
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"} <= own, own


@pytest.mark.parametrize("name", MTP_NAMES)
def test_mtp_draft_continuous_batching(name, tmp_path):
    diff = glm.draft_continuous_batching(Fixture(name), tmp_path)
    assert diff.max() <= TOLERANCE, diff


@pytest.mark.parametrize("name", MTP_NAMES)
def test_mtp_skipped_by_default(name, tmp_path):
    """--mtp skip (default): no mtp.* tensor in the graph, no hidden_states
    output, mtp.onnx refused naming --mtp draft."""
    fx = Fixture(name)
    out = tmp_path / "out"
    proc = subprocess.run([STRATA, "export", fx.model, "--out", str(out)], capture_output=True, text=True, check=True)
    assert "MTP weights (indexed" in proc.stderr and "left out of this export" in proc.stderr, proc.stderr
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert not [i.name for i in model.graph.initializer if i.name.startswith("mtp.")]
    assert "hidden_states" not in [o.name for o in model.graph.output]
    proc = subprocess.run([STRATA, "export", fx.model, "--out", str(tmp_path / "x"), "--extra-model", "mtp"], capture_output=True, text=True)
    assert proc.returncode != 0 and "--mtp draft" in proc.stderr, proc.stderr


def test_convert_keeps_mtp_whole(tmp_path):
    """strata convert --quantize fp8-block: every mtp.* tensor copied as
    stored, none quantised; the layers' projections quantised."""
    fx = Fixture("qwen3next-f32-mtp")
    out = tmp_path / "conv"
    subprocess.run([STRATA, "convert", fx.model, "--out", str(out), "--quantize", "fp8-block"], capture_output=True, text=True, check=True)
    with open(out / "convert-report.json") as f:
        actions = {t["key"]: t["action"] for t in json.load(f)["tensors"]}
    source = os.path.join(fx.model, "model.safetensors")
    mtp = [k for k in safetensors_header(source)[1] if k.startswith("mtp.")]
    assert mtp and {actions[k] for k in mtp} == {"copied"}
    assert actions["model.layers.1.self_attn.q_proj.weight"] == "quantized"
    shard = {k: str(p) for p in out.glob("*.safetensors") for k in safetensors_header(str(p))[1]}
    for k in mtp:
        np.testing.assert_array_equal(read_safetensors(shard[k], k), read_safetensors(source, k))


@pytest.mark.parametrize("name", MTP_NAMES)
def test_inspect_shows_mtp(name):
    """strata inspect (--json and plain): the indexed layout and its keys."""
    fx = Fixture(name)
    out = subprocess.run([STRATA, "inspect", "--json", fx.model], capture_output=True, text=True, check=True).stdout
    mtp = json.loads(out)["mtp"]
    assert mtp["convention"] == "indexed" and not mtp.get("layers")
    assert "mtp.fc.weight" in mtp["keys"] and all(k.startswith("mtp.") for k in mtp["keys"])
    plain = subprocess.run([STRATA, "inspect", fx.model], capture_output=True, text=True, check=True).stdout
    assert f"indexed, {len(mtp['keys'])} tensors" in plain and "--mtp draft exports them as mtp.onnx" in plain, plain
