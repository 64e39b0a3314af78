"""The contract's optional parts, end to end under ONNX Runtime, with the
probe plugin (internal/probeplugin, built into bin/probe by make build): a
Llama whose model.onnx takes inputs_embeds and also returns the final
hidden states, and whose embedding is a separate model, embed.onnx. Run one
after the other they must reproduce transformers' logits, and the logits
must be the head applied to the returned hidden state of the last token."""

import json
import os
import struct

import numpy as np

import ortrun
from test_conformance import ROOT, TOLERANCE, Fixture, export, max_diff_per_step

PROBE = os.path.join(ROOT, "bin", "probe")


def read_tensor(model_dir, key):
    """A float32 tensor from a single-file safetensors checkpoint."""
    path = os.path.join(model_dir, "model.safetensors")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        begin, end = header[key]["data_offsets"]
        assert header[key]["dtype"] == "F32"
        f.seek(8 + n + begin)
        return np.frombuffer(f.read(end - begin), dtype=np.float32).reshape(header[key]["shape"])


class EmbedThenModel:
    """embed.onnx then model.onnx, as a serving loop would run them."""

    def __init__(self, out):
        self.embed = ortrun.session(str(out / "embed.onnx"))
        self.model = ortrun.session(str(out / "model.onnx"))
        self.hidden = []

    def get_inputs(self):
        return self.model.get_inputs()

    def step(self, input_ids, position_ids, caches):
        (embeds,) = self.embed.run(["inputs_embeds"], {"input_ids": input_ids})
        names = [o.name for o in self.model.get_outputs()]
        outs = dict(zip(names, self.model.run(names, {"inputs_embeds": embeds, "position_ids": position_ids, **caches})))
        self.hidden.append((outs["hidden_states"], position_ids))
        retained = {k[: -len("_RetainedState")]: v for k, v in outs.items() if k.endswith("_RetainedState")}
        return outs["logits"], retained


def test_separate_model_inputs_embeds_and_extra_output(tmp_path):
    fx = Fixture("llama-f32-base")
    out = tmp_path / "out"
    export(fx.model, out, "--plugin-dir", PROBE, "--extra-model", "embed")
    runner = EmbedThenModel(out)
    assert [i.name for i in runner.model.get_inputs()][:2] == ["inputs_embeds", "position_ids"]
    assert [o.name for o in runner.model.get_outputs()][:2] == ["logits", "hidden_states"]
    logits = ortrun.run_steps(runner, fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"], fx.meta["ctx_len"])
    diffs = max_diff_per_step(logits, fx.ref["logits"])
    assert diffs.max() <= TOLERANCE, diffs
    head = read_tensor(fx.model, "lm_head.weight")
    for step, (hidden, pos) in enumerate(runner.hidden):
        last = hidden[np.arange(hidden.shape[0]), pos.argmax(axis=1)]  # each row's last valid token
        np.testing.assert_allclose(last @ head.T, logits[step], atol=1e-5, rtol=0)
