"""Quantised checkpoints beyond the logits the fixtures check (manifest.json
lists the quantised fixtures too, so whole, layerwise, materialised and
subfunction exports of each are compared with transformers there):

- the activation quantiser strata ships in the model (FP8 per token, as
  compressed-tensors' FP8_DYNAMIC computes it) equals E4M3 rounding done by
  ml_dtypes, on every binade, ties and the saturation edge;
- what strata does not understand is refused with exit 1, naming it: an
  unknown method, an FP8 checkpoint without its quantization_config, a
  missing scale, a scale of the wrong shape; nothing is written;
- inspect shows the quantisation and counts no scale as a parameter;
- no quantised tensor reaches the graph as a plain Cast.
"""

import json
import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from test_conformance import FIXTURES_DIR, STRATA, export

QUANTISED = sorted(n for n in json.load(open(os.path.join(FIXTURES_DIR, "manifest.json")))["fixtures"]
                   if n.startswith(("llama-fp8", "qwen3moe-fp8", "deepseek-fp8", "llama-ct-", "qwen3moe-ct-", "deepseek-ct-", "llama-modelopt-")))


def strata(*args):
    return subprocess.run([STRATA, *args], capture_output=True, text=True)


def model_dir(name):
    return os.path.join(FIXTURES_DIR, name, "model")


def test_every_format_has_a_fixture():
    formats = {json.load(open(os.path.join(FIXTURES_DIR, n, "model", "config.json")))
               .get("quantization_config", {}).get("quant_method") for n in QUANTISED}
    assert formats == {"fp8", "compressed-tensors", "modelopt"}, formats
    assert len(QUANTISED) >= 13


# --- the activation quantiser ---------------------------------------------------

def fp8_per_token_reference(x):
    """compressed-tensors' FP8_DYNAMIC on x [..., K] in float32: scale =
    max|x|/448 per row (0 -> float32 eps), x/scale clamped to ±448, cast to
    E4M3 (nearest, ties to even), times scale."""
    amax = np.abs(x).max(axis=-1, keepdims=True)
    scale = (amax / np.float32(448)).astype(np.float32)
    scale = np.where(scale == 0, np.finfo(np.float32).eps, scale).astype(np.float32)
    v = np.clip(x / scale, -448, 448).astype(np.float32)
    q = v.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return (q * scale).astype(np.float32)


@pytest.fixture(scope="module")
def quantizer(tmp_path_factory):
    """The FP8DynamicPerToken function of a real export, in a model of its own."""
    out = tmp_path_factory.mktemp("fp8-dynamic") / "out"
    export(model_dir("llama-ct-fp8-dynamic"), out)
    m = onnx.load(str(out / "model.onnx"), load_external_data=False)
    fns = [f for f in m.functions if f.name == "FP8DynamicPerToken"]
    assert len(fns) == 1, [f.name for f in m.functions]
    fn = fns[0]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, None])
    graph = helper.make_graph([helper.make_node(fn.name, ["x"], ["y"], domain=fn.domain)], "q", [x], [y])
    model = helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 17),
                                                                      helper.make_opsetid(fn.domain, 1)])
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda v: sess.run(None, {"x": v})[0]


def test_activation_quantiser_rounds_as_e4m3(quantizer):
    rng = np.random.default_rng(0)
    rows = [rng.normal(size=64) * 10.0 ** rng.integers(-6, 6) for _ in range(200)]
    # every E4M3 value and every midpoint between neighbours (ties), scaled so
    # that the row's maximum maps to exactly 448
    grid = np.unique(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    grid = grid[np.isfinite(grid)]
    mids = (grid[:-1] + grid[1:]) / 2
    rows += [np.concatenate([grid, [448.0]]), np.concatenate([mids, [448.0]]), np.concatenate([-mids, [-448.0]]),
             np.zeros(8), np.full(8, 1e-30), [3.0, -1e-9, 2.0 ** -12]]
    width = max(len(r) for r in rows)
    for r in rows:
        x = np.zeros((1, 1, width), dtype=np.float32)
        x[0, 0, :len(r)] = r
        got, want = quantizer(x), fp8_per_token_reference(x)
        np.testing.assert_array_equal(got, want)


def test_activation_quantiser_is_per_token(quantizer):
    x = np.random.default_rng(1).normal(size=(2, 5, 32)).astype(np.float32)
    x[1, 3] *= 1000  # one loud token must not change the others' scales
    np.testing.assert_array_equal(quantizer(x), fp8_per_token_reference(x))


# --- refusals --------------------------------------------------------------------

def copy_fixture(tmp_path, name):
    dest = tmp_path / name
    shutil.copytree(model_dir(name), dest)
    return dest


def edit_config(path, fn):
    with open(path / "config.json") as f:
        cfg = json.load(f)
    fn(cfg)
    with open(path / "config.json", "w") as f:
        json.dump(cfg, f)


def drop_tensor(path, key):
    """Rewrites model.safetensors without key (header and data)."""
    import struct
    f = path / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    del header[key]
    out, blob = {}, b""
    for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = v["data_offsets"]
        out[k] = {**v, "data_offsets": [len(blob), len(blob) + b - a]}
        blob += data[a:b]
    if meta:
        out["__metadata__"] = meta
    h = json.dumps(out).encode()
    f.write_bytes(struct.pack("<Q", len(h)) + h + blob)


def refused(tmp_path, src, *want):
    out = tmp_path / "out"
    for cmd in (["export", str(src), "--out", str(out)], ["inspect", str(src)]):
        proc = strata(*cmd)
        assert proc.returncode == 1, f"{cmd[0]}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
        for w in want:
            assert w in proc.stderr + proc.stdout, f"{cmd[0]}: {w!r} not in:\n{proc.stderr}{proc.stdout}"
    assert not out.exists(), "a refused export wrote its output directory"


def test_unknown_method_is_refused_by_name(tmp_path):
    src = copy_fixture(tmp_path, "llama-ct-w4a16-group")
    edit_config(src, lambda c: c["quantization_config"].update(quant_method="hqq"))
    refused(tmp_path, src, 'quantization_config.quant_method "hqq" is not supported')


def test_fp8_without_quantization_config_is_refused(tmp_path):
    src = copy_fixture(tmp_path, "llama-fp8-block")
    edit_config(src, lambda c: c.pop("quantization_config"))
    refused(tmp_path, src, "no quantization_config", "model.layers.0.mlp.down_proj.weight (F8_E4M3 [64 96])")


def test_missing_scale_is_refused_naming_it(tmp_path):
    src = copy_fixture(tmp_path, "llama-fp8-block32")
    drop_tensor(src, "model.layers.1.mlp.up_proj.weight_scale_inv")
    refused(tmp_path, src, "model.layers.1.mlp.up_proj.weight_scale_inv, its scale, is missing")


def test_scale_grid_of_another_block_is_refused(tmp_path):
    src = copy_fixture(tmp_path, "llama-fp8-block32")
    edit_config(src, lambda c: c["quantization_config"].update(weight_block_size=[16, 16]))
    refused(tmp_path, src, "is not the grid of [16 16] blocks")


def test_unsupported_activation_scheme_is_refused(tmp_path):
    src = copy_fixture(tmp_path, "llama-ct-fp8-dynamic")
    edit_config(src, lambda c: c["quantization_config"]["config_groups"]["group_0"]["input_activations"]
                .update(strategy="tensor", dynamic=False))
    refused(tmp_path, src, "group_0.input_activations", "is not supported")


# --- inspect and the graph -----------------------------------------------------------

@pytest.mark.parametrize("name", QUANTISED)
def test_inspect_counts_no_scale_as_a_parameter(name):
    proc = strata("inspect", model_dir(name), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    q = report["quantization"]
    assert q["method"] and q["format"] and q["weights"] > 0 and q["scales"] > 0, q
    with open(os.path.join(model_dir(name), "config.json")) as f:
        cfg = json.load(f)
    hidden, inter, vocab, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg["model_type"] == "llama":  # a dense Llama: its exact parameter count
        attn = hidden * hd * (heads + 2 * kv) + heads * hd * hidden
        per_layer = attn + 3 * hidden * inter + 2 * hidden
        want = layers * per_layer + hidden + vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
        assert report["parameters"] == want, (report["parameters"], want)


@pytest.mark.parametrize("name", QUANTISED)
def test_no_quantised_tensor_is_cast_plainly(name, tmp_path):
    """Each FP8 / packed initializer feeds a dequantising decode (Gather from
    the code table, or integer unpacking), never a Cast to a float type."""
    spec = export(model_dir(name), tmp_path / "out")
    m = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    quantised = {s["key"] for w in spec["weights"] for s in w.get("sources", []) if s["dtype"] in ("F8_E4M3", "I32", "U8")}
    assert quantised, "the export reads no quantised tensor"
    for n in m.graph.node:
        if n.op_type == "Cast" and n.input[0] in quantised:
            to = next(a.i for a in n.attribute if a.name == "to")
            assert to not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16), \
                f"{n.input[0]} is cast to a float as if it were a plain weight"
