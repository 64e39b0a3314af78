#!/usr/bin/env python3
"""Serving loops for bench/ort/compare.py: prefill and decode timed under
onnxruntime.InferenceSession, and onnxruntime-genai's tokens/s.

Needs onnxruntime and numpy only (onnxruntime_genai for `genai`), so it runs
in a process of its own that torch never enters:

    serve.py ort MODEL_ONNX SPEC_JSON REPORT_JSON
    serve.py genai MODEL_DIR SPEC_JSON REPORT_JSON

The driver picks its IO from the model's input names, so it runs whatever form
an export has:
- QEfficient's (strata's default): input_ids, position_ids, past_key.{i} /
  past_value.{i} of a fixed ctx_len; each step's *_RetainedState outputs are
  the next step's caches; logits of the last position only.
- The GenAI builder's (and strata's `--target ort`): input_ids, attention_mask,
  position_ids when declared, past_key_values.{i}.key/value -> present.{i}.*;
  logits of every position. With a shared buffer (genai_config's
  past_present_share_buffer, GroupQueryAttention) past and present are one
  max-length buffer and the attention mask's length says how much is valid;
  without, present is fed back as the next step's past and grows.

Every export is run through IO binding: caches stay OrtValues from step to
step (never copied through numpy), as a serving loop keeps them.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def session(path, threads: int):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def np_type(arg) -> type:
    if arg.type not in NP_TYPES:
        raise SystemExit(f"input {arg.name} is {arg.type}: the bench driver feeds {sorted(NP_TYPES)} only; "
                         "export with float32 or float16 caches, or extend serve.NP_TYPES")
    return NP_TYPES[arg.type]


class Driver:
    """One sequence (batch 1) through one model, a step at a time.

    reset(max_len) before each sequence: max_len bounds prompt + generated
    tokens (strata's ctx_len; the builder's shared buffer length). step(ids)
    runs the next len(ids) tokens and returns the last position's logits."""

    def __init__(self, sess, head_dim: int, shared_buffer: bool = False):
        self.sess, self.head_dim, self.shared = sess, head_dim, shared_buffer
        self.inputs = {i.name: i for i in sess.get_inputs()}
        self.outputs = [o.name for o in sess.get_outputs()]
        if any(n.startswith("past_key.") for n in self.inputs):
            self.form = "qeff"
            self.cache_in = [n for n in self.inputs if n.startswith(("past_key.", "past_value."))]
            self.cache_out = {n + "_RetainedState": n for n in self.cache_in}
        elif any(n.startswith("past_key_values.") for n in self.inputs):
            self.form = "builder"
            self.cache_in = [n for n in self.inputs if n.startswith("past_key_values.")]
            # past_key_values.3.key -> present.3.key
            self.cache_out = {"present." + n[len("past_key_values."):]: n for n in self.cache_in}
        else:
            raise SystemExit(f"unknown IO: inputs {sorted(self.inputs)}; the driver knows QEfficient's "
                             "(past_key.{i}) and the GenAI builder's (past_key_values.{i}.key)")
        missing = sorted(set(self.cache_out) - set(self.outputs))
        if missing:
            raise SystemExit(f"{self.form} IO without the cache outputs {missing}: outputs are {self.outputs}")

    def cache_shape(self, name: str, rows: int) -> list[int]:
        dims = []
        for k, d in enumerate(self.inputs[name].shape):
            if isinstance(d, int):
                dims.append(d)
            elif k == 0:
                dims.append(1)  # batch
            elif k == 2:
                dims.append(rows)  # ctx_len, past_sequence_length
            else:
                dims.append(self.head_dim)  # the builder's symbolic kv_cache_dim
        return dims

    def reset(self, max_len: int) -> None:
        self.pos, self.max_len = 0, max_len
        # qeff: a ctx_len cache; builder: an empty past, or the shared max-length buffer.
        rows = max_len if self.form == "qeff" or self.shared else 0
        self.caches = {n: ort.OrtValue.ortvalue_from_numpy(np.zeros(self.cache_shape(n, rows), np_type(self.inputs[n])))
                       for n in self.cache_in}

    def step(self, ids: np.ndarray) -> np.ndarray:
        n = ids.shape[1]
        if self.pos + n > self.max_len:
            raise SystemExit(f"step past max_len {self.max_len}: reset with a longer max_len")
        feeds = {"input_ids": ids.astype(np.int64)}
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.arange(self.pos, self.pos + n, dtype=np.int64)[None]
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = np.ones((1, self.pos + n), np.int64)
        unknown = sorted(set(self.inputs) - set(feeds) - set(self.cache_in))
        if unknown:
            raise SystemExit(f"inputs the driver does not feed: {unknown}")
        b = self.sess.io_binding()
        for name, value in feeds.items():
            b.bind_cpu_input(name, value)
        for name, value in self.caches.items():
            b.bind_ortvalue_input(name, value)
        for name in self.outputs:
            if self.shared and name in self.cache_out:
                b.bind_ortvalue_output(name, self.caches[self.cache_out[name]])  # written in place
            else:
                b.bind_output(name, "cpu")
        self.sess.run_with_iobinding(b)
        outs = dict(zip(self.outputs, b.get_outputs()))
        if not self.shared:
            self.caches = {self.cache_out[k]: v for k, v in outs.items() if k in self.cache_out}
        self.pos += n
        logits = outs["logits"].numpy()
        return logits.reshape(-1, logits.shape[-1])[-1]


def timed_greedy(drv: Driver, prompt: list[int], steps: int) -> dict:
    """Prefill the prompt, then `steps` decode steps: the wall of the
    prefill, each decode step's wall, and the steps + 1 greedy tokens."""
    drv.reset(len(prompt) + steps)
    t = time.perf_counter()
    logits = drv.step(np.array([prompt]))
    prefill = time.perf_counter() - t
    tokens, decode = [int(logits.argmax())], []
    for _ in range(steps):
        t = time.perf_counter()
        logits = drv.step(np.array([[tokens[-1]]]))
        decode.append(time.perf_counter() - t)
        tokens.append(int(logits.argmax()))
    return {"prefill_s": prefill, "decode_s": decode, "tokens": tokens}


def serve_ort(model: Path, spec: dict) -> dict:
    """spec: prompts (lists of ids), steps, runs, threads, head_dim,
    shared_buffer. Per prompt length, each run's prefill wall, median decode
    step and tokens; summarize_ort takes the medians."""
    sess = session(model, spec["threads"])
    drv = Driver(sess, spec["head_dim"], spec.get("shared_buffer", False))
    # Warm-up at the longest prompt: the arena's growth to its size and the
    # first run's allocations are no measured step's cost.
    timed_greedy(drv, max(spec["prompts"], key=len), 2)
    report = {"form": drv.form, "shared_buffer": drv.shared, "lengths": {}}
    for prompt in spec["prompts"]:
        runs = [timed_greedy(drv, prompt, spec["steps"]) for _ in range(spec["runs"])]
        report["lengths"][str(len(prompt))] = {"runs": [
            {"prefill_s": r["prefill_s"], "decode_ms": 1e3 * statistics.median(r["decode_s"]), "tokens": r["tokens"]} for r in runs]}
    return report


def agree(runs: list[dict]) -> dict:
    return {"tokens": runs[0]["tokens"], "runs_agree": all(r["tokens"] == runs[0]["tokens"] for r in runs)}


def summarize_ort(reports: list[dict]) -> dict:
    """The runs of several serve_ort reports (one process per run, run in
    turn with the other exports') as one: per prompt length the median
    prefill, the median over runs of each run's median decode step, the
    first run's tokens and whether every run gave the same."""
    out = {k: reports[0][k] for k in ("form", "shared_buffer")}
    out["lengths"] = {}
    for n in reports[0]["lengths"]:
        runs = [r for rep in reports for r in rep["lengths"][n]["runs"]]
        out["lengths"][n] = {"prefill_s": statistics.median(r["prefill_s"] for r in runs),
                             "decode_ms": statistics.median(r["decode_ms"] for r in runs),
                             "prefill_runs_s": [r["prefill_s"] for r in runs],
                             "decode_runs_ms": [r["decode_ms"] for r in runs], **agree(runs)}
    return out


def serve_genai(model_dir: Path, spec: dict) -> dict:
    """onnxruntime-genai's greedy generation of spec["new_tokens"] tokens
    after spec["prompt"], spec["runs"] times after a warm-up: each run's
    wall over the whole generation (prefill included), over the decode
    steps only, and its tokens."""
    import onnxruntime_genai as og

    config = og.Config(str(model_dir))
    # The same threads as the InferenceSession figures.
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": spec["threads"]}}}}))
    model = og.Model(config)
    prompt, new = spec["prompt"], spec["new_tokens"]
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + new)
    runs = []
    for _ in range(spec["runs"] + 1):  # the first is a warm-up
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(prompt)
        gen.generate_next_token()
        t1 = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        t2 = time.perf_counter()
        tokens = [int(t) for t in gen.get_sequence(0)][len(prompt):]
        runs.append({"total_s": t2 - t0, "decode_s": t2 - t1, "tokens": tokens})
    return {"runs": runs[1:]}


def summarize_genai(reports: list[dict]) -> dict:
    """tokens/s (whole generation, and decode steps only) as medians over
    the runs of several serve_genai reports."""
    runs = [r for rep in reports for r in rep["runs"]]
    return {
        "tokens_per_s": statistics.median(len(r["tokens"]) / r["total_s"] for r in runs),
        "decode_tokens_per_s": statistics.median((len(r["tokens"]) - 1) / r["decode_s"] for r in runs)
        if all(len(r["tokens"]) > 1 for r in runs) else None,
        "tokens_per_s_runs": [len(r["tokens"]) / r["total_s"] for r in runs], **agree(runs),
    }


def main(argv):
    if len(argv) != 4 or argv[0] not in ("ort", "genai"):
        raise SystemExit("usage: serve.py ort|genai MODEL SPEC_JSON REPORT_JSON")
    kind, model, spec = argv[0], Path(argv[1]), json.loads(Path(argv[2]).read_text())
    report = serve_ort(model, spec) if kind == "ort" else serve_genai(model, spec)
    Path(argv[3]).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
