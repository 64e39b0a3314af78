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

import numpy as np
import pytest

import ortrun
import test_gptoss as gptoss
from test_conformance import FIXTURES, TOLERANCE, Fixture, export, max_diff_per_step, window_files

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
