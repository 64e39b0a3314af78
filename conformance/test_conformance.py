"""The oracle: strata's exports, run by ONNX Runtime, must reproduce the
logits Hugging Face transformers recorded for each fixture (see generate.py),
prefill and decode. Also checks the ONNX files with onnx's full checker and
that weights are referenced in the checkpoint, never copied.

Needs bin/strata and its plugins (make build) and the packages in
requirements-test.txt. A missing binary or fixture fails; nothing is skipped.
"""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ortrun

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES_DIR = os.path.join(HERE, "fixtures")
STRATA = os.environ.get("STRATA", os.path.join(ROOT, "bin", "strata"))

# transformers runs these fixtures in float32 (bf16 checkpoints upcast); the
# export computes in float32 too, so only summation order differs.
TOLERANCE = 1e-4

with open(os.path.join(FIXTURES_DIR, "manifest.json")) as f:
    FIXTURES = json.load(f)["fixtures"]


class Fixture:
    def __init__(self, name):
        self.dir = os.path.join(FIXTURES_DIR, name)
        if not os.path.isdir(self.dir):
            pytest.fail(f"fixture {name} is listed in manifest.json but {self.dir} is missing; run `make fixtures`")
        self.model = os.path.join(self.dir, "model")
        with open(os.path.join(self.dir, "fixture.json")) as f:
            self.meta = json.load(f)
        self.ref = np.load(os.path.join(self.dir, "reference.npz"))

    def run(self, model_path):
        sess = ortrun.session(model_path)
        return ortrun.run(sess, self.ref["prompts"], self.ref["prompt_lengths"], self.ref["decode_tokens"],
                          self.meta["ctx_len"])


def export(model_dir, out, *args):
    if not os.access(STRATA, os.X_OK):
        pytest.fail(f"{STRATA} is missing: build it first (make build)")
    proc = subprocess.run([STRATA, "export", model_dir, "--out", str(out), *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"strata export failed:\n{proc.stderr}"
    with open(os.path.join(out, "weight_spec.json")) as f:
        return json.load(f)


def max_diff_per_step(got, want):
    assert got.shape == want.shape, f"logits shape {got.shape}, reference {want.shape}"
    return np.abs(got - want).max(axis=(1, 2))


@pytest.mark.parametrize("name", FIXTURES)
def test_logits_match_transformers(name, tmp_path):
    fx = Fixture(name)
    export(fx.model, tmp_path / "out")
    diffs = max_diff_per_step(fx.run(str(tmp_path / "out" / "model.onnx")), fx.ref["logits"])
    report = ", ".join(f"{'prefill' if i == 0 else f'decode {i}'} {d:.2e}" for i, d in enumerate(diffs))
    print(f"{name}: max |Δlogits| {report}")
    assert diffs.max() <= TOLERANCE, f"{name}: logits differ from transformers: {report}"


@pytest.mark.parametrize("name", FIXTURES)
def test_onnx_full_check(name, tmp_path):
    """onnx's checker with shape inference. onnx refuses external data files
    with several hard links (a guard against hard-link attacks), so this runs
    on an export made with --link copy, the documented way to hand strata's
    output to onnx tooling; the graph is the same."""
    fx = Fixture(name)
    out = tmp_path / "out"
    export(fx.model, out, "--link", "copy")
    path = str(out / "model.onnx")
    onnx.checker.check_model(path, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(onnx.load(path, load_external_data=False), strict_mode=True)
    logits = next(o for o in inferred.graph.output if o.name == "logits")
    assert [d.dim_value or d.dim_param for d in logits.type.tensor_type.shape.dim] == ["batch_size", 1, 128]
    np.testing.assert_allclose(fx.run(path), fx.ref["logits"], atol=TOLERANCE, rtol=0)


def layer_count(fx):
    with open(os.path.join(fx.model, "config.json")) as f:
        cfg = json.load(f)
    return cfg.get("text_config", cfg)["num_hidden_layers"]  # multimodal configs nest the language model's


def window_files(out):
    """windows/window_<first>_<last>.onnx, in layer order."""
    names = [n for n in os.listdir(out / "windows") if n.endswith(".onnx")]
    return [str(out / "windows" / n) for n in sorted(names, key=lambda n: int(n.split("_")[1]))]


@pytest.mark.parametrize("subfunctions", [False, True], ids=["inlined", "subfunctions"])
@pytest.mark.parametrize("name", FIXTURES)
def test_layerwise_matches_transformers(name, subfunctions, tmp_path):
    """For every window size: the stitched model, and the window models run
    one after another passing hidden states, both reproduce transformers."""
    fx = Fixture(name)
    layers = layer_count(fx)
    for size in range(1, layers + 1):
        out = tmp_path / f"window-{size}"
        args = ["--layerwise", "--window-size", str(size), "--keep-windows"]
        export(fx.model, out, *(args + ["--subfunctions"] if subfunctions else args))
        files = window_files(out)
        assert len(files) == -(-layers // size), files
        stitched = max_diff_per_step(fx.run(str(out / "model.onnx")), fx.ref["logits"])
        windows = max_diff_per_step(
            ortrun.run(ortrun.Windows(files), fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"],
                       fx.meta["ctx_len"]), fx.ref["logits"])
        print(f"{name} window {size}: stitched {stitched.max():.2e}, windows in sequence {windows.max():.2e}")
        assert stitched.max() <= TOLERANCE and windows.max() <= TOLERANCE


MOE_FIXTURES = [n for n in FIXTURES if n.startswith("qwen3moe")]


def moe_layers(fx):
    """Layer indices transformers makes sparse (Qwen3MoeDecoderLayer's rule)."""
    with open(os.path.join(fx.model, "config.json")) as f:
        cfg = json.load(f)
    step, dense = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers", [])
    return [i for i in range(cfg["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0]


def op_counts(path):
    """TopK and ScatterElements nodes, and Gathers indexed by a TopK's
    indices (expert weights picked per token)."""
    model = onnx.load(path, load_external_data=False)
    nodes = list(model.graph.node) + [n for f in model.functions for n in f.node]
    routed = {n.output[1] for n in nodes if n.op_type == "TopK"}
    return {"TopK": sum(n.op_type == "TopK" for n in nodes),
            "ScatterElements": sum(n.op_type == "ScatterElements" for n in nodes),
            "expert Gather": sum(n.op_type == "Gather" and n.input[1] in routed for n in nodes)}


@pytest.mark.parametrize("name", MOE_FIXTURES)
def test_moe_expert_strategies(name, tmp_path):
    """--moe-strategy gather (each token's k experts, weights gathered) and
    dense (every expert, weighed by the routing): both reproduce
    transformers, whole and layerwise (window 1, layer functions, stitched
    and window by window), and each builds the graph it names."""
    fx = Fixture(name)
    sparse = len(moe_layers(fx))
    counts = {}
    for strategy in ("gather", "dense"):
        out = tmp_path / strategy
        export(fx.model, out, "--moe-strategy", strategy)
        path = str(out / "model.onnx")
        diffs = max_diff_per_step(fx.run(path), fx.ref["logits"])
        counts[strategy] = op_counts(path)
        lw = tmp_path / f"{strategy}-layerwise"
        export(fx.model, lw, "--moe-strategy", strategy, "--layerwise", "--subfunctions", "--keep-windows")
        stitched = max_diff_per_step(fx.run(str(lw / "model.onnx")), fx.ref["logits"])
        windows = max_diff_per_step(
            ortrun.run(ortrun.Windows(window_files(lw)), fx.ref["prompts"], fx.ref["prompt_lengths"],
                       fx.ref["decode_tokens"], fx.meta["ctx_len"]), fx.ref["logits"])
        report = f"whole {diffs.max():.2e}, layerwise stitched {stitched.max():.2e}, windows {windows.max():.2e}"
        print(f"{name} {strategy}: max |Δlogits| {report}")
        assert max(diffs.max(), stitched.max(), windows.max()) <= TOLERANCE, f"{name} --moe-strategy {strategy}: {report}"
    assert counts["gather"]["TopK"] == counts["dense"]["TopK"] == sparse, counts
    assert (counts["gather"]["expert Gather"], counts["dense"]["expert Gather"]) == (3 * sparse, 0), counts  # gate, up, down
    assert (counts["gather"]["ScatterElements"], counts["dense"]["ScatterElements"]) == (0, sparse), counts


def expected_layer_calls(fx):
    """The layer function each decoder layer calls, by transformers' rule."""
    if fx.meta["name"].startswith("qwen3moe"):
        sparse = moe_layers(fx)
        return ["Qwen3MoeDecoderLayer" if i in sparse else "Qwen3MoeDenseDecoderLayer" for i in range(layer_count(fx))]
    return ["LlamaDecoderLayer"] * layer_count(fx)


@pytest.mark.parametrize("name", ["llama-bf16-sharded", "qwen3moe-bf16-top4-sparse"])
def test_subfunctions_full_check(name, tmp_path):
    """Decoder layers as local functions (calling the custom-op functions)
    pass onnx's full check; each layer kind is one function (two where dense
    and MoE layers mix), called in layer order; no function holds an op the
    compiler rejects there."""
    fx = Fixture(name)
    out = tmp_path / "out"
    export(fx.model, out, "--subfunctions", "--link", "copy")
    path = str(out / "model.onnx")
    onnx.checker.check_model(path, full_check=True)
    model = onnx.load(path, load_external_data=False)
    calls = [n.op_type for n in model.graph.node if n.domain.startswith("strata.")]
    assert calls == expected_layer_calls(fx)
    custom_ops = {"CtxGather", "CtxScatter", "CustomRMSNorm"}
    assert sorted(f.name for f in model.functions) == sorted(custom_ops | set(calls))
    for f in model.functions:
        if f.name not in custom_ops:
            ops = {n.op_type for n in f.node}
            assert "Range" not in ops and "Expand" not in ops, f"the compiler rejects {ops & {'Range', 'Expand'}} in functions"
    np.testing.assert_allclose(fx.run(path), fx.ref["logits"], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", FIXTURES)
def test_subfunctions_head_is_the_only_model_level_product(name, tmp_path):
    """ONNX Runtime pre-packs weights in node order, the layer calls' inlined
    bodies after the model's own nodes: with the head the only product at
    model level, the largest weight is packed first and the session peaks
    about its size lower (docs/compile.md)."""
    out = tmp_path / "out"
    export(Fixture(name).model, out, "--subfunctions")
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    products = [n.name for n in model.graph.node if n.op_type in ("Gemm", "MatMul")]
    assert products == ["final/lm_head/Gemm"], products


def safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return 8 + n, json.loads(f.read(n))


@pytest.mark.parametrize("name", FIXTURES)
def test_weights_referenced_in_place(name, tmp_path):
    """Every initializer is external data pointing at the exact bytes of its
    tensor in the checkpoint shard, reached through a hard link: same inode,
    nothing copied. Offsets are re-derived here from the shard headers."""
    fx = Fixture(name)
    out = tmp_path / "out"
    spec = export(fx.model, out)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert model.graph.initializer, "no initializers"
    # The metadata points at weight_spec.json (its hash and counts) rather
    # than holding it; no path of the machine is in either.
    meta = {p.key: p.value for p in model.metadata_props}
    ref = json.loads(meta["strata.weight_spec"])
    with open(out / ref["path"], "rb") as f:
        spec_bytes = f.read()
    assert ref == {"format": "strata.weight_spec", "version": 1, "path": "weight_spec.json",
                   "sha256": hashlib.sha256(spec_bytes).hexdigest(),
                   "weights": len(spec["weights"]), "files": len(spec["files"])}
    assert json.loads(spec_bytes) == spec
    assert not os.path.isabs(spec["checkpoint"]) and os.sep not in spec["checkpoint"], spec["checkpoint"]
    for data in (spec_bytes, open(out / "model.onnx", "rb").read()):
        assert os.path.abspath(fx.model).encode() not in data, "an absolute path of the machine is in the output"
    files = {f["path"]: f for f in spec["files"]}
    assert {f["kind"] for f in spec["files"]} == {"checkpoint"}
    for init in model.graph.initializer:
        assert init.data_location == onnx.TensorProto.EXTERNAL, f"{init.name} is stored in the model"
        ext = {e.key: e.value for e in init.external_data}
        linked = out / ext["location"]
        source = os.path.join(fx.model, files[ext["location"]]["source"])
        assert os.path.samefile(linked, source), f"{linked} is not a hard link to {source}"
        start, header = safetensors_header(source)
        # A packed tensor may be read as its bytes (UINT8) under key::bytes.
        key, as_bytes = init.name.removesuffix("::bytes"), init.name.endswith("::bytes")
        begin, end = header[key]["data_offsets"]
        assert (int(ext["offset"]), int(ext["length"])) == (start + begin, end - begin), init.name
        if as_bytes:
            assert init.data_type == onnx.TensorProto.UINT8 and np.prod(init.dims) == end - begin, init.name
        else:
            assert list(init.dims) == header[key]["shape"]
    sources = {s["key"] for w in spec["weights"] for s in w["sources"]}
    assert sources == {i.name.removesuffix("::bytes") for i in model.graph.initializer}


@pytest.mark.parametrize("name", FIXTURES)
def test_materialized_weights_give_the_same_logits(name, tmp_path):
    """--weights materialize computes every weight in Go (casts included)
    into OUT/weights/*.safetensors; ONNX Runtime then gives the same logits,
    bit for bit, as the export that references the checkpoint, whole and
    layerwise."""
    fx = Fixture(name)
    export(fx.model, tmp_path / "ref")
    reference = fx.run(str(tmp_path / "ref" / "model.onnx"))
    for label, args in [("whole", []), ("layerwise", ["--layerwise", "--keep-windows"]),
                        ("sharded", ["--shard-size", "50kB"])]:
        out = tmp_path / label
        spec = export(fx.model, out, "--weights", "materialize", *args)
        if label == "sharded":
            # save_pretrained's layout: shards and an index naming each weight's
            with open(out / "weights" / "model.safetensors.index.json") as f:
                index = json.load(f)["weight_map"]
            files = {f["path"] for f in spec["files"] if f["kind"] == "materialized"}
            assert len(files) > 1 and {"weights/" + v for v in index.values()} == files
            assert set(index) == {w["name"] for w in spec["weights"]}
        assert spec["mode"] == "materialize" and all(w["data"] for w in spec["weights"])
        data = [f for f in spec["files"] if f["kind"] == "materialized"]
        assert data and all(os.path.getsize(out / f["path"]) == f["size"] for f in data)
        model = onnx.load(str(out / "model.onnx"), load_external_data=False)
        assert not [n for n in model.graph.node if n.op_type == "Cast" and n.name.startswith("weights/")]
        got = fx.run(str(out / "model.onnx"))
        assert np.array_equal(got, reference), f"{label}: max |Δ| {np.abs(got - reference).max()}"
        if label == "layerwise":
            windows = ortrun.run(ortrun.Windows(window_files(out)), fx.ref["prompts"], fx.ref["prompt_lengths"],
                                 fx.ref["decode_tokens"], fx.meta["ctx_len"])
            assert np.array_equal(windows, reference)


class FedWeights:
    """A session whose weights are graph inputs (the qaic form), fed here
    from the safetensors files the version-5 spec names."""

    def __init__(self, path, spec, root):
        self.sess = ortrun.session(path)
        self.weights = {}
        for i in spec["inputs"]:
            f = spec["files"][i["location"]["file"]]
            assert f["format"] == "safetensors"
            self.weights[i["name"]] = read_safetensors(os.path.join(root, f["path"]), i["location"]["key"])

    def get_inputs(self):
        return self.sess.get_inputs()

    def get_outputs(self):
        return self.sess.get_outputs()

    def run(self, names, feeds):
        return self.sess.run(names, {**feeds, **self.weights})


def read_safetensors(path, key):
    start, header = safetensors_header(path)
    entry = header[key]
    dt = {"F32": np.float32, "F16": np.float16}[entry["dtype"]]
    begin, end = entry["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + begin)
        return np.frombuffer(f.read(end - begin), dtype=dt).reshape(entry["shape"])


def test_qaic_weight_spec(tmp_path):
    """--weight-spec qaic: weights become graph inputs, mapped by QEfficient's
    version-5 spec (files/inputs, also under com.qti.aisw.extdata) to keys of
    the materialised safetensors files. Fed from there, the model gives the
    reference logits."""
    fx = Fixture("llama-bf16-sharded")
    out = tmp_path / "out"
    spec = export(fx.model, out, "--weights", "materialize", "--weight-spec", "qaic")
    with open(out / "weight_spec_qaic.json") as f:
        qaic = json.load(f)
    assert qaic["version"] == 5 and qaic["model_name"] == "LlamaForCausalLM"
    assert qaic["model_id"] == "weights"  # relative to the export directory: no path of the machine
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert not model.graph.initializer
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["com.qti.aisw.extdata"]) == qaic
    assert meta["com.qti.aisw.extdata"] == json.dumps(qaic, sort_keys=True, separators=(",", ":"))
    inputs = {i.name for i in model.graph.input}
    assert {i["name"] for i in qaic["inputs"]} == {w["name"] for w in spec["weights"]} <= inputs
    sess = FedWeights(str(out / "model.onnx"), qaic, str(out))
    got = ortrun.run(sess, fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"], fx.meta["ctx_len"])
    np.testing.assert_allclose(got, fx.ref["logits"], atol=TOLERANCE, rtol=0)


BIN_TWINS = [n for n in FIXTURES if os.path.isdir(os.path.join(FIXTURES_DIR, n, "model-bin"))]


@pytest.mark.parametrize("name", BIN_TWINS)
def test_bin_twin_matches_transformers(name, tmp_path):
    """The PyTorch .bin twin of a fixture (the same weights as torch.save
    pickles), converted once into a directory and exported from there,
    reproduces transformers' logits, bit for bit the safetensors export's."""
    assert len(BIN_TWINS) == 2, BIN_TWINS
    fx = Fixture(name)
    export(fx.model, tmp_path / "safetensors")
    twin = os.path.join(fx.dir, "model-bin")
    assert any(n.endswith(".bin") for n in os.listdir(twin))
    export(twin, tmp_path / "bin", "--bin-to", str(tmp_path / "converted"))
    got = fx.run(str(tmp_path / "bin" / "model.onnx"))
    assert np.abs(got - fx.ref["logits"]).max() <= TOLERANCE
    assert np.array_equal(got, fx.run(str(tmp_path / "safetensors" / "model.onnx")))


FULL_BATCH = 3


@pytest.mark.parametrize("name", FIXTURES)
def test_continuous_batching(name, tmp_path):
    """--continuous-batching: a KV cache of full_batch_size rows; each
    sequence is prefilled alone into its own slot (batch_index), then both
    decode together from slots 2 and 0. Logits match transformers'."""
    fx = Fixture(name)
    export(fx.model, tmp_path / "out", "--continuous-batching")
    sess = ortrun.session(str(tmp_path / "out" / "model.onnx"))
    shape = next(i for i in sess.get_inputs() if ortrun.is_cache(i.name)).shape
    assert shape[0] == "full_batch_size"
    names = [o.name for o in sess.get_outputs()]
    caches = ortrun.empty_caches(sess, FULL_BATCH, fx.meta["ctx_len"])
    prompts, lengths, tokens = fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"]
    slots = [2, 0]

    def step(ids, pos, slot_rows):
        outs = dict(zip(names, sess.run(names, {"input_ids": ids, "position_ids": pos,
                                                "batch_index": np.array(slot_rows, dtype=np.int64), **caches})))
        caches.update({k[: -len("_RetainedState")]: v for k, v in outs.items() if k.endswith("_RetainedState")})
        return outs["logits"][:, 0, :]

    got = [np.zeros_like(fx.ref["logits"][0]) for _ in range(1 + tokens.shape[1])]
    for b, slot in enumerate(slots):
        n = lengths[b]
        got[0][b] = step(prompts[b : b + 1, :n], np.arange(n, dtype=np.int64)[None, :], [[slot]])[0]
    for s in range(tokens.shape[1]):
        pos = (lengths + s)[:, None].astype(np.int64)
        got[s + 1] = step(tokens[:, s : s + 1].astype(np.int64), pos, [[slot] for slot in slots])
    diff = max_diff_per_step(np.stack(got), fx.ref["logits"])
    assert diff.max() <= TOLERANCE, f"continuous batching: {diff}"


@pytest.mark.parametrize("name", FIXTURES)
def test_compute_context_length(name, tmp_path):
    """--ccl: attention reads the first len(comp_ctx_lengths) cache rows of
    a ctx_len cache. A compute length shorter than ctx_len gives the logits of
    the full length (and transformers') while the positions fit in it."""
    fx = Fixture(name)
    export(fx.model, tmp_path / "out", "--ccl")
    path = str(tmp_path / "out" / "model.onnx")
    needed = int(fx.ref["prompt_lengths"].max()) + fx.ref["decode_tokens"].shape[1]
    results = {}
    for ccl in (needed, fx.meta["ctx_len"]):
        sess = WithInputs(ortrun.session(path), comp_ctx_lengths=np.zeros(ccl, dtype=np.int64))
        results[ccl] = ortrun.run(sess, fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"], fx.meta["ctx_len"])
    short, full = results[needed], results[fx.meta["ctx_len"]]
    assert needed < fx.meta["ctx_len"]
    assert np.abs(short - full).max() <= 1e-5
    assert max_diff_per_step(short, fx.ref["logits"]).max() <= TOLERANCE


class WithInputs:
    """A session with some inputs fixed for every run."""

    def __init__(self, sess, **fixed):
        self.sess, self.fixed = sess, fixed

    def get_inputs(self):
        return self.sess.get_inputs()

    def get_outputs(self):
        return self.sess.get_outputs()

    def run(self, names, feeds):
        return self.sess.run(names, {**feeds, **self.fixed})


def test_compile_with_onnxruntime(tmp_path):
    """strata compile --backend ort: ONNX Runtime's optimiser writes an
    optimised model (and the ORT format) that ONNX Runtime loads and that
    gives transformers' logits."""
    fx = Fixture("llama-bf16-sharded")
    out = tmp_path / "compiled"
    proc = subprocess.run([STRATA, "compile", fx.model, "--out", str(out), "--backend", "ort", "--ort-format",
                           "--python", sys.executable], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with open(out / "ort_report.json") as f:
        report = json.load(f)
    assert report["onnxruntime"] == ort.__version__ and report["nodes_after"] > 0
    for model in (out / "model.optimized.onnx", out / "model.ort"):
        diffs = max_diff_per_step(fx.run(str(model)), fx.ref["logits"])
        assert diffs.max() <= TOLERANCE, f"{model.name}: {diffs}"


def test_float16_compute(tmp_path):
    """--dtype float16 computes in half precision (weights cast in-graph,
    norms and softmax in float32), so the tolerance is relative to the logits'
    scale: 1% of the largest reference logit (measured: 0.3%)."""
    for name in ["llama-f32-base", "llama-bf16-gqa2"]:
        fx = Fixture(name)
        out = tmp_path / name
        spec = export(fx.model, out, "--dtype", "float16")
        assert spec["compute_dtype"] == "float16"
        sess = ortrun.session(str(out / "model.onnx"))
        assert sess.get_inputs()[2].type == "tensor(float16)"
        diffs = max_diff_per_step(fx.run(str(out / "model.onnx")), fx.ref["logits"])
        scale = np.abs(fx.ref["logits"]).max()
        print(f"{name} float16: max |Δlogits| {diffs.max():.3e} of scale {scale:.2f}")
        assert diffs.max() <= 0.01 * scale


def test_symlinked_data_refused_by_onnxruntime(tmp_path):
    """Why strata hard-links by default: ONNX Runtime refuses external data
    that resolves outside the model's directory, which a symlink does."""
    fx = Fixture(FIXTURES[0])
    out = tmp_path / "out"
    export(fx.model, out, "--link", "symlink")
    with pytest.raises(Exception, match="(?i)outside|escape|external"):
        ortrun.session(str(out / "model.onnx"))


def test_demo_greedy_matches_transformers(tmp_path):
    """The shipped demo model: greedy tokens from strata + ONNX Runtime equal
    transformers' greedy generate."""
    demo = os.path.join(ROOT, "examples", "tiny-llama")
    ref = np.load(os.path.join(demo, "reference.npz"))
    with open(os.path.join(demo, "fixture.json")) as f:
        meta = json.load(f)
    export(os.path.join(demo, "model"), tmp_path / "out")
    sess = ortrun.session(str(tmp_path / "out" / "model.onnx"))
    got = ortrun.greedy(sess, ref["prompts"], ref["prompt_lengths"], meta["greedy_tokens"], meta["ctx_len"])
    np.testing.assert_array_equal(got, ref["greedy"])


def loads(loader, path):
    """Whether loader really loads the model at path (with its data)."""
    try:
        if loader == "onnx":
            onnx.load(path)
            onnx.checker.check_model(path)
        else:
            ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        return True
    except Exception:
        return False


@pytest.mark.parametrize("weights", ["reference", "materialize"])
@pytest.mark.parametrize("link", ["auto", "hardlink", "copy", "symlink"])
def test_check_says_what_the_loaders_do(link, weights, tmp_path):
    """strata check's verdict for each loader is what onnx and ONNX Runtime
    do with the export. The default (--link auto) clones where the file
    system can, which both load; where it cannot it hard-links (ONNX Runtime
    only), across file systems it copies, saying which; --link copy is what
    the onnx package loads anywhere. Materialised, the model reads weights/
    and checkpoint/ is provenance: --link auto's note advises --link copy
    only where the onnx package really refuses the export. (Run with
    --basetemp on a btrfs/XFS mount for the reflink case: pytest's tmp_path
    decides the file system.)"""
    fx = Fixture("llama-bf16-sharded")
    src = tmp_path / "src"  # on tmp_path's file system, as the output
    shutil.copytree(fx.model, src)
    out = tmp_path / link
    proc = subprocess.run([STRATA, "export", str(src), "--out", str(out), "--link", link, "--weights", weights], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with open(out / "weight_spec.json") as f:
        used = {f["link"] for f in json.load(f)["files"] if f["kind"] == "checkpoint"}
    if link == "auto":  # reflink; else hardlink; across file systems, copy: each said
        assert used in ({"reflink"}, {"hardlink"}, {"copy"}), used
        said = weights == "reference" and used == {"hardlink"}
        assert said == ("hard-linked, not cloned" in proc.stderr), proc.stderr
        assert (used == {"copy"}) == ("shards copied" in proc.stderr), proc.stderr
    check = subprocess.run([STRATA, "check", str(out), "--json"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    verdicts = {v["loader"]: v["accepts"] for v in json.loads(check.stdout)["loaders"]}
    model = str(out / "model.onnx")
    real = {"onnx": loads("onnx", model), "onnxruntime": loads("onnxruntime", model)}
    assert verdicts == real, (used, verdicts, real)
    assert ("--link copy" in proc.stderr) == (link == "auto" and not real["onnx"]), (proc.stderr, real)
    if used <= {"reflink", "copy"} or weights == "materialize" and link != "symlink":
        assert real == {"onnx": True, "onnxruntime": True}


def test_check_finds_a_broken_export(tmp_path):
    fx = Fixture("llama-bf16-sharded")
    out = tmp_path / "out"
    export(fx.model, out, "--link", "copy")
    shard = sorted((out / "checkpoint").iterdir())[0]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    check = subprocess.run([STRATA, "check", str(out)], capture_output=True, text=True)
    assert check.returncode == 1 and "ends at byte" in check.stdout and "broken" in check.stderr, check
    assert not loads("onnxruntime", str(out / "model.onnx"))
