"""DeepSeek-V3 family (plugins/deepseek) beyond the generic suite: both MLA
forms (absorbed, expanded) in every schedule, the QEfficient cache
convention (compressed_kv.{i}, k_pe.{i} and their _RetainedState outputs),
layer functions per kind, chunked prefill, Kimi-K2's model_type, the MTP
layer kept out by default and the MTP draft (mtp.onnx) against a reference
composed from transformers' modules (gen_deepseek.py), strata convert
carrying the MTP layer."""

import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest

import ortrun
import test_conformance as tc
import test_glm as glm
import test_gptoss as gptoss

NAMES = [n for n in tc.FIXTURES if n.startswith(("deepseek-", "glm4lite-"))]
MTP_FIXTURES = [n for n in NAMES if os.path.exists(os.path.join(tc.FIXTURES_DIR, n, "mtp_reference.npz"))]
FORMS = ["absorbed", "expanded"]
CACHES = ("compressed_kv", "k_pe")
TOLERANCE = tc.TOLERANCE


def config(fx):
    with open(os.path.join(fx.model, "config.json")) as f:
        return json.load(f)


def dense(cfg, i):
    if "mlp_layer_types" in cfg:
        return cfg["mlp_layer_types"][i] == "dense"
    return i < cfg["first_k_dense_replace"]


def test_fixtures_cover_the_variants():
    cfgs = {n: config(tc.Fixture(n)) for n in NAMES}
    assert {c["q_lora_rank"] is None for c in cfgs.values()} == {True, False}
    assert {c["rope_interleave"] for c in cfgs.values()} == {True, False}
    assert {c["model_type"] for c in cfgs.values()} == {"deepseek_v3", "glm4_moe_lite"}
    assert any(c["n_group"] > 1 and c["topk_group"] < c["n_group"] for c in cfgs.values())
    assert any(c.get("first_k_dense_replace", 0) >= 2 for c in cfgs.values())
    assert any(c["rope_parameters"].get("rope_type") == "yarn" and c["rope_parameters"]["mscale_all_dim"] for c in cfgs.values())
    assert any(c["attention_bias"] for c in cfgs.values())
    assert all(c["v_head_dim"] != c["qk_nope_head_dim"] for c in cfgs.values())
    assert {tc.Fixture(n).meta["checkpoint_dtype"] for n in NAMES} == {"float32", "bfloat16"}
    assert {c["model_type"] for n, c in cfgs.items() if n in MTP_FIXTURES} == {"deepseek_v3", "glm4_moe_lite"}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", NAMES)
def test_mla_forms_whole_and_layerwise(name, form, tmp_path):
    """Each form, whole and layerwise (stitched and window by window), with
    QEfficient's cache IO: compressed_kv.{i} [batch, ctx_len, kv_lora_rank]
    then k_pe.{i} [batch, 1, ctx_len, qk_rope_head_dim] per layer."""
    fx = tc.Fixture(name)
    cfg = config(fx)
    worst, report = glm.whole_and_layerwise(fx, tmp_path, "--plugin-option", f"mla_form={form}")
    print(f"{name} {form}: max |Δlogits| {report} (logit scale {np.abs(fx.ref['logits']).max():.2f})")
    assert worst <= TOLERANCE, report
    sess = ortrun.session(str(tmp_path / "whole" / "model.onnx"))
    caches = [i for i in sess.get_inputs() if ortrun.is_cache(i.name)]
    want = [f"{c}.{i}" for i in range(cfg["num_hidden_layers"]) for c in CACHES]
    assert [c.name for c in caches] == want
    assert caches[0].shape == ["batch_size", "ctx_len", cfg["kv_lora_rank"]]
    assert caches[1].shape == ["batch_size", 1, "ctx_len", cfg["qk_rope_head_dim"]]
    assert [o.name for o in sess.get_outputs()] == ["logits"] + [w + "_RetainedState" for w in want]


@pytest.mark.parametrize("name", NAMES)
def test_layer_functions_per_kind(name, tmp_path):
    """--subfunctions: one function per kind (dense, MoE) called in layer
    order; onnx's full check passes."""
    fx = tc.Fixture(name)
    cfg = config(fx)
    prefix = "Glm4MoeLite" if cfg["model_type"] == "glm4_moe_lite" else "DeepseekV3"
    calls, _ = glm.subfunction_calls(fx, tmp_path)
    assert calls == [prefix + ("DenseDecoderLayer" if dense(cfg, i) else "DecoderLayer") for i in range(cfg["num_hidden_layers"])]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", NAMES)
def test_chunked_prefill(name, form, tmp_path):
    """Prompts fed in chunks of 3 and 2, each continuing the latent cache."""
    fx = tc.Fixture(name)
    tc.export(fx.model, tmp_path / "out", "--plugin-option", f"mla_form={form}")
    sess = ortrun.session(str(tmp_path / "out" / "model.onnx"))
    report = {chunk: tc.max_diff_per_step(gptoss.run_chunked(sess, fx, chunk), fx.ref["logits"]).max() for chunk in (2, 3)}
    assert max(report.values()) <= TOLERANCE, report


def test_kimi_k2_model_type(tmp_path):
    """Kimi-K2's config.json names model_type kimi_k2 and DeepSeek-V3's
    class: the same export, the same logits."""
    fx = tc.Fixture("deepseek-f32-qlora-groups")
    model = tmp_path / "kimi"
    shutil.copytree(fx.model, model)
    cfg = config(fx)
    cfg["model_type"] = "kimi_k2"
    (model / "config.json").write_text(json.dumps(cfg))
    tc.export(str(model), tmp_path / "out")
    np.testing.assert_allclose(fx.run(str(tmp_path / "out" / "model.onnx")), fx.ref["logits"], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_mtp_skipped_by_default(name, tmp_path):
    """--mtp skip (default), as for GLM (test_glm's checks: no MTP tensor in
    the graph, no hidden_states output, mtp.onnx refused naming --mtp draft,
    the export says the layer is left out); inspect shows the layer."""
    glm.test_mtp_skipped_by_default(name, tmp_path)
    fx = tc.Fixture(name)
    layer = config(fx)["num_hidden_layers"]
    out = subprocess.run([tc.STRATA, "inspect", "--json", fx.model], capture_output=True, text=True, check=True).stdout
    mtp = json.loads(out)["mtp"]
    assert mtp["convention"] == "inlined" and mtp["layers"] == [layer]
    assert f"model.layers.{layer}.enorm.weight" in mtp["keys"] and f"model.layers.{layer}.hnorm.weight" in mtp["keys"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("mode", ["whole", "layerwise-subfunctions", "materialize"])
@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_mtp_draft_matches_reference(name, mode, form, tmp_path):
    """--mtp draft: mtp.onnx (its own compressed_kv/k_pe cache) against the
    reference draft, fed model.onnx's hidden states or the reference's."""
    fx = tc.Fixture(name)
    out = tmp_path / "out"
    tc.export(fx.model, out, *glm.mtp_args(mode), "--plugin-option", f"mla_form={form}")
    layer = glm.check_draft(fx, out, mode, caches=CACHES)
    own = {i.name.split("::")[0] for i in onnx.load(str(out / "mtp.onnx"), load_external_data=False).graph.initializer}
    surgery = fx.meta["options"]["mla_mtp_layer"]
    head = f"model.layers.{layer}.shared_head.head.weight" if surgery["own_head"] else "lm_head.weight"
    embed = f"model.layers.{layer}.embed_tokens.weight" if surgery["own_embed"] else "model.embed_tokens.weight"
    assert {f"model.layers.{layer}.eh_proj.weight", head, embed} <= own, own


@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_mtp_draft_continuous_batching(name, tmp_path):
    diff = glm.draft_continuous_batching(tc.Fixture(name), tmp_path)
    assert diff.max() <= TOLERANCE, diff


@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_convert_keeps_mtp(name, tmp_path):
    """strata convert carries the MTP layer's tensors: every
    model.layers.{N}.* key of the source is in the converted checkpoint."""
    fx = tc.Fixture(name)
    layer = config(fx)["num_hidden_layers"]
    out = tmp_path / "conv"
    subprocess.run([tc.STRATA, "convert", fx.model, "--out", str(out), "--dtype", "bfloat16"], capture_output=True, text=True, check=True)
    with open(out / "model.safetensors.index.json") as f:
        converted = set(json.load(f)["weight_map"])
    with open(os.path.join(fx.model, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    mtp = {k for k in header if k.startswith(f"model.layers.{layer}.")}
    assert mtp and mtp <= converted, sorted(mtp - converted)
