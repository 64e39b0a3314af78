"""glm4_moe (plugins/glm) beyond the generic suite: both MoE strategies,
layer functions per kind (dense, MoE), chunked prefill, the MTP layer kept
out of the main graph by default, and the MTP draft (mtp.onnx) against a
reference composed from transformers' own modules (gen_glm.py: the MTP
layer's Glm4MoeDecoderLayer with its cache, Glm4MoeRMSNorm, the rotary
embedding, wired as vLLM's Glm4MoeMultiTokenPredictorLayer) fed the main
model's final-norm hidden states, over a prefill and decode steps."""

import json
import os
import subprocess

import numpy as np
import onnx
import pytest

import ortrun
import test_conformance as tc

GLM = [n for n in tc.FIXTURES if n.startswith("glm-")]
MTP_FIXTURE = "glm-f32-mtp"
MTP_FIXTURES = [n for n in GLM if os.path.exists(os.path.join(tc.FIXTURES_DIR, n, "mtp_reference.npz"))]
TOLERANCE = tc.TOLERANCE


def config(fx):
    with open(os.path.join(fx.model, "config.json")) as f:
        return json.load(f)


def layer_calls(fx):
    cfg = config(fx)
    return ["Glm4MoeDenseDecoderLayer" if i < cfg["first_k_dense_replace"] else "Glm4MoeDecoderLayer"
            for i in range(cfg["num_hidden_layers"])]


def test_fixtures_cover_the_variants():
    cfgs = {n: config(tc.Fixture(n)) for n in GLM}
    assert {c["use_qk_norm"] for c in cfgs.values()} == {True, False}
    assert any(c["n_group"] > 1 and c["topk_group"] < c["n_group"] for c in cfgs.values())
    assert any(c["first_k_dense_replace"] >= 2 for c in cfgs.values())
    assert any(c["routed_scaling_factor"] != 1 for c in cfgs.values())
    assert any(c["n_shared_experts"] > 1 for c in cfgs.values())
    assert any("partial_rotary_factor" not in c["rope_parameters"] for c in cfgs.values())
    assert {tc.Fixture(n).meta["checkpoint_dtype"] for n in GLM} == {"float32", "bfloat16"}


def whole_and_layerwise(fx, tmp_path, *args):
    """Exports with args whole (tmp_path/whole) and layerwise, window 1 with
    layer functions (tmp_path/layerwise); returns the largest max |Δlogits|
    of the whole, stitched and window-by-window runs, and a report."""
    tc.export(fx.model, tmp_path / "whole", *args)
    whole = tc.max_diff_per_step(fx.run(str(tmp_path / "whole" / "model.onnx")), fx.ref["logits"])
    lw = tmp_path / "layerwise"
    tc.export(fx.model, lw, *args, "--layerwise", "--window-size", "1", "--subfunctions", "--keep-windows")
    stitched = tc.max_diff_per_step(fx.run(str(lw / "model.onnx")), fx.ref["logits"])
    windows = tc.max_diff_per_step(ortrun.run(ortrun.Windows(tc.window_files(lw)), fx.ref["prompts"], fx.ref["prompt_lengths"],
                                              fx.ref["decode_tokens"], fx.meta["ctx_len"]), fx.ref["logits"])
    report = f"whole {whole.max():.2e}, stitched {stitched.max():.2e}, windows {windows.max():.2e}"
    return max(whole.max(), stitched.max(), windows.max()), report


@pytest.mark.parametrize("strategy", ["gather", "dense"])
@pytest.mark.parametrize("name", GLM)
def test_moe_strategies_whole_and_layerwise(name, strategy, tmp_path):
    worst, report = whole_and_layerwise(tc.Fixture(name), tmp_path, "--moe-strategy", strategy)
    print(f"{name} {strategy}: max |Δlogits| {report}")
    assert worst <= TOLERANCE, report


@pytest.mark.parametrize("name", GLM)
def test_layer_functions_per_kind(name, tmp_path):
    """--subfunctions: one function per kind (dense, MoE) called in layer
    order; onnx's full check passes."""
    fx = tc.Fixture(name)
    calls, functions = subfunction_calls(fx, tmp_path)
    assert calls == layer_calls(fx)
    assert {"Glm4MoeDenseDecoderLayer", "Glm4MoeDecoderLayer"} <= functions


def subfunction_calls(fx, tmp_path):
    """Exports with --subfunctions (--link copy): onnx's full check passes
    and the logits are transformers'; returns the layer functions called,
    in order, and the functions the model holds."""
    out = tmp_path / "out"
    tc.export(fx.model, out, "--subfunctions", "--link", "copy")
    path = str(out / "model.onnx")
    onnx.checker.check_model(path, full_check=True)
    model = onnx.load(path, load_external_data=False)
    np.testing.assert_allclose(fx.run(path), fx.ref["logits"], atol=TOLERANCE, rtol=0)
    return [n.op_type for n in model.graph.node if n.domain.startswith("strata.")], {f.name for f in model.functions}


@pytest.mark.parametrize("name", GLM)
def test_chunked_prefill(name, tmp_path):
    """A prompt fed in two chunks, the second continuing the cache (row 1's
    second chunk mostly padding), then decode: transformers' logits."""
    fx = tc.Fixture(name)
    tc.export(fx.model, tmp_path / "out")
    sess = ortrun.session(str(tmp_path / "out" / "model.onnx"))
    prompts, lengths, tokens, ctx = fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"], fx.meta["ctx_len"]
    caches = ortrun.empty_caches(sess, len(lengths), ctx)
    split = 3
    pos = ortrun.prefill_positions(lengths, prompts.shape[1])
    _, caches = ortrun.step(sess, prompts[:, :split], pos[:, :split], caches)
    logits, caches = ortrun.step(sess, prompts[:, split:], pos[:, split:], caches)
    got = [logits[:, 0]]
    for s in range(tokens.shape[1]):
        logits, caches = ortrun.step(sess, tokens[:, s:s + 1], (lengths + s)[:, None].astype(np.int64), caches)
        got.append(logits[:, 0])
    diff = tc.max_diff_per_step(np.stack(got), fx.ref["logits"])
    assert diff.max() <= TOLERANCE, diff


@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_mtp_skipped_by_default(name, tmp_path):
    """--mtp skip (default): no MTP tensor reaches the graph, model.onnx has
    no hidden_states output, and mtp.onnx is refused with the reason."""
    fx = tc.Fixture(name)
    layer = config(fx)["num_hidden_layers"]
    spec = tc.export(fx.model, tmp_path / "out")
    keys = json.dumps(spec)
    assert f"model.layers.{layer - 1}." in keys and f"model.layers.{layer}." not in keys
    model = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    assert not [i.name for i in model.graph.initializer if i.name.startswith(f"model.layers.{layer}.")]
    assert "hidden_states" not in [o.name for o in model.graph.output]
    proc = subprocess.run([tc.STRATA, "export", fx.model, "--out", str(tmp_path / "x"), "--extra-model", "mtp"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "--mtp draft" in proc.stderr, proc.stderr
    proc = subprocess.run([tc.STRATA, "export", fx.model, "--out", str(tmp_path / "y")], capture_output=True, text=True, check=True)
    assert f"MTP weights (inlined, layers [{layer}]" in proc.stderr and "left out of this export" in proc.stderr, proc.stderr


def run_main(sess, ref, ctx):
    """model.onnx's logits and hidden_states: prefill [B,W,H], decode [steps,B,H]."""
    names = [o.name for o in sess.get_outputs()]
    prompts, lengths, tokens = ref["prompts"], ref["prompt_lengths"], ref["decode_tokens"]
    caches = ortrun.empty_caches(sess, len(lengths), ctx)

    def step(ids, pos):
        outs = dict(zip(names, sess.run(names, {"input_ids": ids, "position_ids": pos, **caches})))
        caches.update({k[: -len("_RetainedState")]: v for k, v in outs.items() if k.endswith("_RetainedState")})
        return outs["logits"][:, 0], outs["hidden_states"]

    logits, prefill = step(prompts, ortrun.prefill_positions(lengths, prompts.shape[1]))
    all_logits, decode = [logits], []
    for s in range(tokens.shape[1]):
        logits, h = step(tokens[:, s:s + 1], (lengths + s)[:, None].astype(np.int64))
        all_logits.append(logits)
        decode.append(h[:, 0])
    return np.stack(all_logits), prefill, np.stack(decode)


def run_draft(sess, ref, hidden_prefill, hidden_decode, ctx):
    """mtp.onnx as a serving engine runs it: a prefill over the prompt with
    input_ids one step ahead (the prompt shifted by one, then the first
    decode token), then one token per step; logits [steps, B, V]."""
    names = [o.name for o in sess.get_outputs()]
    prompts, lengths, tokens = ref["prompts"], ref["prompt_lengths"], ref["decode_tokens"]
    caches = ortrun.empty_caches(sess, len(lengths), ctx)

    def step(ids, pos, hidden):
        outs = dict(zip(names, sess.run(names, {"input_ids": ids, "position_ids": pos, "hidden_states": hidden, **caches})))
        caches.update({k[: -len("_RetainedState")]: v for k, v in outs.items() if k.endswith("_RetainedState")})
        return outs["logits"][:, 0]

    ahead = np.zeros_like(prompts)
    for b, n in enumerate(lengths):
        ahead[b, : n - 1] = prompts[b, 1:n]
        ahead[b, n - 1] = tokens[b, 0]
    got = [step(ahead, ortrun.prefill_positions(lengths, prompts.shape[1]), hidden_prefill.astype(np.float32))]
    for s in range(tokens.shape[1] - 1):
        got.append(step(tokens[:, s + 1:s + 2], (lengths + s)[:, None].astype(np.int64), hidden_decode[s][:, None].astype(np.float32)))
    return np.stack(got)


def mtp_args(mode):
    """The export flags of a draft test mode."""
    args = ["--mtp", "draft"]
    if mode == "materialize":
        args += ["--weights", "materialize"]
    if mode == "layerwise-subfunctions":
        args += ["--layerwise", "--window-size", "1", "--subfunctions", "--keep-windows", "--extra-model", "mtp"]
    return args


def check_draft(fx, out, mode, caches=("past_key", "past_value")):
    """The export in out (mtp_args(mode)) against mtp_reference.npz:
    model.onnx also returns the final-norm hidden states (transformers'
    last_hidden_state, every valid position) with unchanged logits;
    mtp.onnx (its caches named caches.{layer}), fed them, gives the
    reference draft's logits, and fed the reference's hidden states too.
    Returns the MTP layer index."""
    mtp = np.load(os.path.join(fx.dir, "mtp_reference.npz"))
    layer = int(mtp["mtp_layer"])
    if mode == "layerwise-subfunctions":
        # windows of one layer: the last window's hidden_states output is
        # hidden_states_final beside its hidden_states input, renamed back
        # when stitched (host/window/io.go ExtraOutputName)
        last = onnx.load(tc.window_files(out)[-1], load_external_data=False)
        assert "hidden_states" in [i.name for i in last.graph.input]
        assert "hidden_states_final" in [o.name for o in last.graph.output]
    ctx = fx.meta["ctx_len"]
    logits, prefill, decode = run_main(ortrun.session(str(out / "model.onnx")), fx.ref, ctx)
    assert tc.max_diff_per_step(logits, fx.ref["logits"]).max() <= TOLERANCE
    valid = ortrun.prefill_positions(fx.ref["prompt_lengths"], prefill.shape[1]) >= 0
    hidden_diff = max(np.abs(prefill - mtp["hidden_prefill"])[valid].max(), np.abs(decode - mtp["hidden_decode"]).max())
    draft = ortrun.session(str(out / "mtp.onnx"))
    inputs = [i.name for i in draft.get_inputs()]
    assert inputs == ["input_ids", "position_ids", "hidden_states"] + [f"{c}.{layer}" for c in caches], inputs
    assert [o.name for o in draft.get_outputs()] == ["logits"] + [f"{c}.{layer}_RetainedState" for c in caches]
    from_ref = tc.max_diff_per_step(run_draft(draft, fx.ref, mtp["hidden_prefill"], mtp["hidden_decode"], ctx), mtp["draft_logits"])
    chained = tc.max_diff_per_step(run_draft(draft, fx.ref, prefill, decode, ctx), mtp["draft_logits"])
    print(f"{os.path.basename(fx.dir)} {mode}: hidden_states {hidden_diff:.2e}; draft logits (reference hidden) "
          + ", ".join(f"{d:.2e}" for d in from_ref) + f"; chained after model.onnx {chained.max():.2e}"
          + f"; logit scale {np.abs(mtp['draft_logits']).max():.2f}")
    assert hidden_diff <= TOLERANCE and from_ref.max() <= TOLERANCE and chained.max() <= TOLERANCE
    assert np.abs(mtp["draft_logits"]).max() > 1  # a logit scale the tolerance means something at
    return layer


@pytest.mark.parametrize("mode", ["whole", "layerwise-subfunctions", "materialize"])
@pytest.mark.parametrize("name", MTP_FIXTURES)
def test_mtp_draft_matches_reference(name, mode, tmp_path):
    """--mtp draft (mtp.onnx without --extra-model, which the layerwise mode
    also names): check_draft; no MTP weight in model.onnx; the MTP layer's
    own embedding and head where the checkpoint has them."""
    fx = tc.Fixture(name)
    out = tmp_path / "out"
    tc.export(fx.model, out, *mtp_args(mode))
    layer = check_draft(fx, out, mode)
    main = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert not [i.name for i in main.graph.initializer if i.name.startswith(f"model.layers.{layer}.")]  # no MTP weight
    # the MTP layer's own embedding and head where the checkpoint has them, else the main model's
    own = {i.name.split("::")[0] for i in onnx.load(str(out / "mtp.onnx"), load_external_data=False).graph.initializer}
    surgery = fx.meta["options"]["mtp_layer"]
    head = f"model.layers.{layer}.shared_head.head.weight" if surgery["own_head"] else "lm_head.weight"
    embed = f"model.layers.{layer}.embed_tokens.weight" if surgery["own_embed"] else "model.embed_tokens.weight"
    assert {f"model.layers.{layer}.eh_proj.weight", head, embed} <= own, own


def draft_continuous_batching(fx, tmp_path):
    """mtp.onnx with --continuous-batching: its cache has full_batch_size
    rows addressed by batch_index; rows prefilled alone into slots 2 and 0,
    decoded together. The max |Δlogits| per step against the reference."""
    mtp = np.load(os.path.join(fx.dir, "mtp_reference.npz"))
    out = tmp_path / "out"
    tc.export(fx.model, out, "--mtp", "draft", "--extra-model", "mtp", "--continuous-batching")
    sess = ortrun.session(str(out / "mtp.onnx"))
    names = [o.name for o in sess.get_outputs()]
    caches = ortrun.empty_caches(sess, 3, fx.meta["ctx_len"])
    prompts, lengths, tokens = fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"]
    slots = [2, 0]

    def step(ids, pos, hidden, rows):
        outs = dict(zip(names, sess.run(names, {"input_ids": ids, "position_ids": pos, "hidden_states": hidden.astype(np.float32),
                                                "batch_index": np.array(rows, dtype=np.int64), **caches})))
        caches.update({k[: -len("_RetainedState")]: v for k, v in outs.items() if k.endswith("_RetainedState")})
        return outs["logits"][:, 0]

    got = [np.zeros_like(mtp["draft_logits"][0]) for _ in range(tokens.shape[1])]
    for b, slot in enumerate(slots):
        n = int(lengths[b])
        ids = np.array([list(prompts[b, 1:n]) + [tokens[b, 0]]], dtype=np.int64)
        got[0][b] = step(ids, np.arange(n, dtype=np.int64)[None], mtp["hidden_prefill"][b:b + 1, :n], [[slot]])[0]
    for s in range(tokens.shape[1] - 1):
        got[s + 1] = step(tokens[:, s + 1:s + 2], (lengths + s)[:, None].astype(np.int64), mtp["hidden_decode"][s][:, None],
                          [[slot] for slot in slots])
    return tc.max_diff_per_step(np.stack(got), mtp["draft_logits"])


def test_mtp_draft_continuous_batching(tmp_path):
    diff = draft_continuous_batching(tc.Fixture(MTP_FIXTURE), tmp_path)
    assert diff.max() <= TOLERANCE, diff


def test_inspect_shows_mtp():
    """strata inspect (plain and --json) names the MTP convention, layers and keys."""
    fx = tc.Fixture(MTP_FIXTURE)
    layer = config(fx)["num_hidden_layers"]
    out = subprocess.run([tc.STRATA, "inspect", "--json", fx.model], capture_output=True, text=True, check=True).stdout
    mtp = json.loads(out)["mtp"]
    assert mtp["convention"] == "inlined" and mtp["layers"] == [layer]
    assert f"model.layers.{layer}.eh_proj.weight" in mtp["keys"] and all(k.startswith(f"model.layers.{layer}.") for k in mtp["keys"])
    plain = subprocess.run([tc.STRATA, "inspect", fx.model], capture_output=True, text=True, check=True).stdout
    assert f"inlined, layers [{layer}]" in plain and "left out of the export" in plain


@pytest.mark.parametrize("name", ["glm-f32-qknorm-groups", "glm-bf16-dense2-shared2"])
def test_float16_compute(name, tmp_path):
    """--dtype float16: the router still scores in float32 (the correction
    bias arrives in float16 and is cast up); within 1% of the logit scale,
    as the generic float16 test asks."""
    fx = tc.Fixture(name)
    tc.export(fx.model, tmp_path / "out", "--dtype", "float16")
    diffs = tc.max_diff_per_step(fx.run(str(tmp_path / "out" / "model.onnx")), fx.ref["logits"])
    scale = np.abs(fx.ref["logits"]).max()
    print(f"{name} float16: max |Δlogits| {diffs.max():.3e} of scale {scale:.2f}")
    assert diffs.max() <= 0.01 * scale


def test_mtp_draft_full_check(tmp_path):
    """model.onnx (with hidden_states) and mtp.onnx pass onnx's full check
    and strict shape inference (--link copy, as onnx tooling needs)."""
    fx = tc.Fixture(MTP_FIXTURE)
    out = tmp_path / "out"
    tc.export(fx.model, out, "--mtp", "draft", "--extra-model", "mtp", "--link", "copy")
    for name in ("model", "mtp"):
        path = str(out / f"{name}.onnx")
        onnx.checker.check_model(path, full_check=True)
        inferred = onnx.shape_inference.infer_shapes(onnx.load(path, load_external_data=False), strict_mode=True)
        logits = next(o for o in inferred.graph.output if o.name == "logits")
        assert [d.dim_value or d.dim_param for d in logits.type.tensor_type.shape.dim] == ["batch_size", 1, 128]


def test_mtp_draft_compute_context_length(tmp_path):
    """mtp.onnx with --ccl: a comp_ctx_lengths input shorter than ctx_len
    that still covers the positions gives the reference draft's logits."""
    fx = tc.Fixture(MTP_FIXTURE)
    mtp = np.load(os.path.join(fx.dir, "mtp_reference.npz"))
    out = tmp_path / "out"
    tc.export(fx.model, out, "--mtp", "draft", "--extra-model", "mtp", "--ccl")
    needed = int(fx.ref["prompt_lengths"].max()) + fx.ref["decode_tokens"].shape[1]
    sess = tc.WithInputs(ortrun.session(str(out / "mtp.onnx")), comp_ctx_lengths=np.zeros(needed, dtype=np.int64))
    got = run_draft(sess, fx.ref, mtp["hidden_prefill"], mtp["hidden_decode"], fx.meta["ctx_len"])
    assert tc.max_diff_per_step(got, mtp["draft_logits"]).max() <= TOLERANCE
