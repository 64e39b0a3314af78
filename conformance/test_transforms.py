"""Weight transforms: the in-graph lowering (ONNX nodes, run by ONNX Runtime)
and the materialised one (Go) must give the same bits, for random transforms
and chains across dtypes; and both must equal transformers' own MXFP4 and FP8
dequantisation on the recorded fixture.

bin/strata-transformcases writes each case: source tensors, model.onnx (the
in-graph lowering as its only output) and expected.bin (Go's bytes, or for
the fixture, transformers' bytes)."""

import ctypes
import json
import os
import subprocess

import numpy as np
import onnxruntime as ort
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOL = os.path.join(ROOT, "bin", "strata-transformcases")
FIXTURE = os.path.join(HERE, "fixtures", "transforms")

NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "uint8": np.uint8,
         "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8, "float8_e8m0": np.uint8}


def cases(tmp_path, *args):
    if not os.access(TOOL, os.X_OK):
        pytest.fail(f"{TOOL} is missing: build it first (make build)")
    subprocess.run([TOOL, "--out", str(tmp_path), *args], check=True)
    with open(tmp_path / "cases.json") as f:
        return json.load(f)


def same_bits(got, want, dtype):
    """Equal bytes, except that any NaN equals any NaN (payloads may differ)."""
    if got.tobytes() == want.tobytes():
        return True
    if dtype not in ("float32", "float16"):
        return False
    g, w = got.astype(np.float64), want.astype(np.float64)
    return bool(np.all((g == w) | (np.isnan(g) & np.isnan(w))))


def output_bytes(model, like):
    """The model's single output as raw bytes shaped like `like`: ONNX
    Runtime's Python API cannot hand out bfloat16 as numpy, so the output is
    read from its buffer."""
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (value,) = sess.run_with_ort_values(None, {})
    raw = ctypes.string_at(value.data_ptr(), like.nbytes)
    return np.frombuffer(raw, dtype=like.dtype).reshape(like.shape)


def run_cases(tmp_path, *args):
    results = []
    for c in cases(tmp_path, *args):
        d = tmp_path / c["name"]
        want = np.fromfile(d / c["expected"], dtype=NUMPY[c["dtype"]]).reshape(c["shape"])
        results.append((c, same_bits(output_bytes(d / "model.onnx", want), want, c["dtype"])))
    return results


def test_random_transforms_lower_to_the_same_bits(tmp_path):
    results = run_cases(tmp_path, "--count", "400", "--seed", "7")
    ops = {op for c, _ in results for op in ("cast", "transpose", "reshape", "stack", "concat", "slice",
                                             "mxfp4_dequant", "fp8_dequant") if op + "(" in c["expr"]}
    assert len(ops) == 8, f"the random cases miss transforms: {sorted(ops)}"
    bad = [c["name"] + ": " + c["expr"] for c, ok in results if not ok]
    assert not bad, f"{len(bad)} of {len(results)} cases differ between ONNX Runtime and Go:\n" + "\n".join(bad[:20])


def test_dequantisation_matches_transformers(tmp_path):
    if not os.path.isdir(FIXTURE):
        pytest.fail(f"{FIXTURE} is missing; run `make fixtures`")
    results = run_cases(tmp_path, "--fixture", FIXTURE)
    assert len(results) >= 6
    bad = [c["name"] + ": " + c["expr"] for c, ok in results if not ok]
    assert not bad, "ONNX Runtime's dequantisation differs from transformers':\n" + "\n".join(bad)
