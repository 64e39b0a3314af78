"""MoE routers: the SDK's build.Router of each kind, run by ONNX Runtime, picks
the experts transformers' router modules pick, with the same weights
(fixtures/routers, written by generate.py from Qwen3MoeTopKRouter,
GptOssTopKRouter and Glm4MoeTopkRouter). bin/strata-routercases writes one
model per case. Experts are compared as sets per token: transformers'
grouped router takes top-k unsorted."""

import json
import os
import struct
import subprocess

import numpy as np
import onnxruntime as ort
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOL = os.path.join(ROOT, "bin", "strata-routercases")
FIXTURE = os.path.join(HERE, "fixtures", "routers")
TOLERANCE = 1e-6

with open(os.path.join(FIXTURE, "cases.json")) as f:
    CASES = json.load(f)


def load_safetensors(path):
    """F32 and I64 tensors of a safetensors file as numpy arrays."""
    dtypes = {"F32": np.float32, "I64": np.int64}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for key, t in header.items():
        if key == "__metadata__":
            continue
        start, end = t["data_offsets"]
        out[key] = np.frombuffer(data[start:end], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    if not os.access(TOOL, os.X_OK):
        pytest.fail(f"{TOOL} is missing: build it first (make build)")
    out = tmp_path_factory.mktemp("routers")
    subprocess.run([TOOL, "--fixture", FIXTURE, "--out", str(out)], check=True)
    return out


def by_expert(weights, indices):
    """Each token's (expert, weight) pairs in expert order."""
    order = np.argsort(indices, axis=-1)
    return np.take_along_axis(indices, order, -1), np.take_along_axis(weights, order, -1)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_router_matches_transformers(case, models):
    tensors = load_safetensors(os.path.join(FIXTURE, "inputs.safetensors"))
    name = case["name"]
    sess = ort.InferenceSession(str(models / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: tensors[f"{name}.{i.name}"] for i in sess.get_inputs()}
    assert sorted(feeds) == case["inputs"]
    weights, indices = sess.run(["weights", "indices"], feeds)
    got_idx, got_w = by_expert(weights, indices)
    want_idx, want_w = by_expert(tensors[f"{name}.expected_weights"], tensors[f"{name}.expected_indices"])
    np.testing.assert_array_equal(got_idx, want_idx, err_msg=f"{name}: experts chosen differ")
    np.testing.assert_allclose(got_w, want_w, atol=TOLERANCE, rtol=0, err_msg=f"{name}: expert weights differ")
