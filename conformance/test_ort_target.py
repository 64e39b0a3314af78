"""strata export --target ort: ONNX Runtime's form (GroupQueryAttention,
SimplifiedLayerNormalization, onnxruntime-genai's decoder IO) must
reproduce transformers' logits (prefill and decode, each step's present fed
back as the next past) and greedy tokens, run by ONNX Runtime and by
onnxruntime-genai's Generator; architectures that do not map are refused.

Needs bin/strata and its plugins (make build), the packages in
requirements-test.txt (onnxruntime-genai among them) and the greedy
references gen_ort.py writes. A missing fixture or package fails; nothing
is skipped.
"""

import json
import os
import stat
import subprocess

import numpy as np
import onnx
import pytest

import ortrun
from gen_ort import GREEDY_TOKENS, ORT_GREEDY
from test_conformance import FIXTURES, STRATA, TOLERANCE, Fixture, export, max_diff_per_step

# Every fixture of a plugin that declares the target, but the quantised
# Llamas (the host's business, the same in either form).
ORT_FIXTURES = [n for n in FIXTURES if n.startswith(("llama-f32-", "llama-bf16-", "qwen3-", "mistral-", "olmo2-", "phi3-", "qwen3moe-", "glm-"))]

# Fixtures onnxruntime-genai runs: a Llama (GQA's own rotary), a Qwen3 (q/k
# norms), each a float32 and a bf16 checkpoint, a Qwen3-MoE and a GLM-4.x
# MoE (partial rotary, grouped sigmoid router, shared experts).
GENAI_FIXTURES = ["llama-f32-base", "llama-bf16-gqa2", "qwen3-bf16-gqa4", "qwen3-f32-bias-tied", "qwen3moe-f32-top2-norm",
                  "glm-f32-qknorm-groups"]


def export_ort(fx, out, *args):
    return export(fx.model, out, "--target", "ort", *args)


class Session:
    """A --target ort model run as onnxruntime-genai runs it: input_ids and
    attention_mask (1 for every token so far; right padding), each step's
    present.{i}.* fed back as past_key_values.{i}.*. Its logits are every
    position's, or with --logits last each row's last valid token's."""

    def __init__(self, path):
        self.sess = ortrun.session(path)
        self.names = [o.name for o in self.sess.get_outputs()]
        self.inputs = {i.name: i for i in self.sess.get_inputs()}
        self.last_only = self.sess.get_outputs()[0].shape[1] == 1

    def last_rows(self, logits, lengths, past):
        """Each row's logits of its last valid token, [B,V], from a step
        after past tokens, after which the rows hold lengths tokens."""
        if self.last_only:
            assert logits.shape[1] == 1, logits.shape
            return logits[:, 0]
        return logits[np.arange(len(lengths)), np.asarray(lengths) - 1 - past]

    def empty(self, batch):
        past = {}
        for name, i in self.inputs.items():
            if name.startswith("past_key_values."):
                past[name] = np.zeros((batch, i.shape[1], 0, i.shape[3]), dtype=ortrun.ORT_TYPES[i.type])
        return past

    def step(self, ids, lengths, past):
        """Logits [B,S,V] of tokens ids [B,S] whose rows now hold lengths
        tokens (past and new), and the next past."""
        width = past_len(past) + ids.shape[1]
        mask = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
        outs = dict(zip(self.names, self.sess.run(self.names, {"input_ids": ids.astype(np.int64), "attention_mask": mask, **past})))
        nxt = {"past_key_values." + k[len("present."):]: v for k, v in outs.items() if k.startswith("present.")}
        return outs["logits"], nxt

    def run(self, prompts, lengths, decode_tokens):
        """Logits [1 + steps, B, V] as the fixtures record them."""
        lengths = np.asarray(lengths)
        logits, past = self.step(prompts, lengths, self.empty(len(prompts)))
        out = [self.last_rows(logits, lengths, 0)]
        for s in range(decode_tokens.shape[1]):
            logits, past = self.step(decode_tokens[:, s : s + 1], lengths + s + 1, past)
            out.append(logits[:, 0])
        return np.stack(out).astype(np.float32)

    def greedy(self, prompts, lengths, n):
        lengths = np.asarray(lengths)
        logits, past = self.step(prompts, lengths, self.empty(len(prompts)))
        token = self.last_rows(logits, lengths, 0).argmax(-1)
        tokens = [token]
        for s in range(n - 1):
            logits, past = self.step(token[:, None], lengths + s + 1, past)
            token = logits[:, 0].argmax(-1)
            tokens.append(token)
        return np.stack(tokens, axis=1)


def past_len(past):
    return next(iter(past.values())).shape[2]


def greedy_reference(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", name, "greedy.npz")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: run `cd conformance && ../.venv/client/bin/python gen_ort.py {name}`")
    return np.load(path)["greedy"]


def test_fixture_lists():
    assert set(ORT_GREEDY) <= set(ORT_FIXTURES) and set(GENAI_FIXTURES) <= set(ORT_GREEDY)
    assert {n.split("-")[0] for n in ORT_FIXTURES} == {"llama", "qwen3", "mistral", "olmo2", "phi3", "qwen3moe", "glm"}


@pytest.mark.parametrize("name", ORT_FIXTURES)
def test_logits_match_transformers(name, tmp_path):
    fx = Fixture(name)
    export_ort(fx, tmp_path / "out")
    got = Session(str(tmp_path / "out" / "model.onnx")).run(fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"])
    diffs = max_diff_per_step(got, fx.ref["logits"])
    scale = np.abs(fx.ref["logits"]).max()
    print(f"{name}: max |Δlogits| {diffs.max():.2e} (logit scale {scale:.2f})")
    assert diffs.max() <= TOLERANCE, f"{name}: --target ort logits differ from transformers: {diffs}"


@pytest.mark.parametrize("args", [["--dtype", "float16"], ["--subfunctions"], ["--logits", "last"], ["--logits", "last", "--subfunctions"]],
                         ids=["float16", "subfunctions", "last", "last-subfunctions"])
@pytest.mark.parametrize("name", ["llama-f32-base", "qwen3-f32-bias-tied", "mistral-f32-sliding", "qwen3moe-f32-top2-norm"])
def test_other_forms(name, args, tmp_path):
    """--subfunctions computes the same; --dtype float16 within 2% of the
    logits' scale, as the default form's float16 test allows; --logits last
    gives each row of the right-padded batch its last token's logits."""
    fx = Fixture(name)
    export_ort(fx, tmp_path / "out", *args)
    got = Session(str(tmp_path / "out" / "model.onnx")).run(fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"])
    diffs = max_diff_per_step(got, fx.ref["logits"])
    limit = 0.02 * np.abs(fx.ref["logits"]).max() if "float16" in args else TOLERANCE
    print(f"{name} {args}: max |Δlogits| {diffs.max():.2e}")
    assert diffs.max() <= limit


@pytest.mark.parametrize("args", [[], ["--weights", "materialize"], ["--moe-strategy", "fused", "--logits", "last"],
                                  ["--moe-strategy", "gather"], ["--moe-strategy", "dense"]],
                         ids=["default", "materialize", "fused-last", "gather", "dense"])
@pytest.mark.parametrize("name", ["qwen3moe-f32-fused-mixed", "qwen3moe-bf16-top4-sparse", "qwen3moe-fp8-block"])
def test_moe_strategies(name, args, tmp_path):
    """Qwen3-MoE's sparse layers run as ONNX Runtime's MoE op (one node a
    layer, the experts' gate and up rows interleaved as its CPU kernel
    takes them) unless --moe-strategy says gather or dense (standard ops);
    each reproduces transformers' logits, the per-expert and fused layouts,
    bf16 and FP8 experts alike."""
    fx = Fixture(name)
    out = tmp_path / "out"
    export_ort(fx, out, *args)
    nodes = onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node
    moe = sum(n.op_type == "MoE" and n.domain == "com.microsoft" for n in nodes)
    with open(os.path.join(fx.model, "config.json")) as f:
        hf = json.load(f)
    sparse = sum(1 for i in range(hf["num_hidden_layers"])
                 if i not in hf.get("mlp_only_layers", []) and (i + 1) % hf.get("decoder_sparse_step", 1) == 0)
    fused = "gather" not in args and "dense" not in args
    assert moe == (sparse if fused else 0), f"{moe} MoE nodes for {sparse} sparse layers ({args})"
    got = Session(str(out / "model.onnx")).run(fx.ref["prompts"], fx.ref["prompt_lengths"], fx.ref["decode_tokens"])
    diffs = max_diff_per_step(got, fx.ref["logits"])
    print(f"{name} {args}: max |Δlogits| {diffs.max():.2e}")
    assert diffs.max() <= TOLERANCE, f"{name} {args}: {diffs}"


@pytest.mark.parametrize("name,args,message", [
    ("qwen3moe-f32-top2-norm", ["--moe-strategy", "fused"], "moe_strategy fused is ONNX Runtime's MoE op: export with --target ort"),
    ("glm-f32-fused", ["--target", "ort", "--moe-strategy", "fused"], 'moe_strategy "fused": use gather or dense'),
])
def test_fused_moe_refusals(name, args, message, tmp_path):
    """The MoE op is ONNX Runtime's (--target ort) and takes softmax routers
    only: GLM's sigmoid groups have no such form."""
    fx = Fixture(name)
    proc = subprocess.run([STRATA, "export", fx.model, "--out", str(tmp_path / "out"), *args], capture_output=True, text=True)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ORT_GREEDY)
def test_greedy_matches_transformers(name, tmp_path):
    fx = Fixture(name)
    export_ort(fx, tmp_path / "out")
    want = greedy_reference(name)
    got = Session(str(tmp_path / "out" / "model.onnx")).greedy(fx.ref["prompts"], fx.ref["prompt_lengths"], GREEDY_TOKENS)
    np.testing.assert_array_equal(got, want)


def export_for_genai(fx, out, want, logits):
    """Exports fx for onnxruntime-genai (--link copy, --logits logits) and
    returns out and its end and pad token. The reference generates past the
    end token (eos_token_id=None); genai stops at it (min_length would mask
    its logit instead): genai is given one the reference never generates."""
    export_ort(fx, out, "--link", "copy", "--logits", logits)
    with open(out / "genai_config.json") as f:
        cfg = json.load(f)
    end = min(set(range(cfg["model"]["vocab_size"])) - set(want.flat))
    cfg["model"]["eos_token_id"] = cfg["model"]["pad_token_id"] = end
    with open(out / "genai_config.json", "w") as f:
        json.dump(cfg, f)
    return out, end


@pytest.mark.parametrize("logits", ["all", "last"])
@pytest.mark.parametrize("name", GENAI_FIXTURES)
def test_genai_generates_transformers_greedy(name, logits, tmp_path):
    """onnxruntime_genai.Model(DIR) and its Generator (greedy search, its
    shared past/present buffer) generate transformers' greedy tokens, from
    every position's logits and from the last token's (a pruned model to
    genai)."""
    import onnxruntime_genai as og

    fx = Fixture(name)
    want = greedy_reference(name)
    out, _ = export_for_genai(fx, tmp_path / "out", want, logits)
    model = og.Model(str(out))
    for row, (prompt, n) in enumerate(zip(fx.ref["prompts"], fx.ref["prompt_lengths"])):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=int(n) + GREEDY_TOKENS)
        gen = og.Generator(model, params)
        gen.append_tokens(prompt[None, :n].astype(np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        got = np.array(gen.get_sequence(0))[n:]
        np.testing.assert_array_equal(got, want[row], err_msg=f"{name} prompt {row}")


@pytest.mark.parametrize("logits", ["all", "last"])
@pytest.mark.parametrize("name", ["llama-f32-base", "qwen3moe-f32-top2-norm"])
def test_genai_batch_generates_transformers_greedy(name, logits, tmp_path):
    """One Generator over the fixture's prompts as a batch, onnxruntime-genai
    padding the shorter on the right: each row generates its transformers
    greedy tokens, so the last-token pick (--logits last) reads each row's
    own last token, not the pad after it."""
    import onnxruntime_genai as og

    fx = Fixture(name)
    want = greedy_reference(name)
    out, pad = export_for_genai(fx, tmp_path / "out", want, logits)
    lengths = [int(n) for n in fx.ref["prompt_lengths"]]
    assert len(set(lengths)) > 1, "the fixture's prompts must differ in length for the padding to matter"
    padded = np.full((len(lengths), max(lengths)), pad, np.int32)
    for row, n in enumerate(lengths):
        padded[row, :n] = fx.ref["prompts"][row, :n]
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max(lengths) + GREEDY_TOKENS, batch_size=len(lengths))
    gen = og.Generator(model, params)
    gen.append_tokens(padded)
    while not gen.is_done():
        gen.generate_next_token()
    for row in range(len(lengths)):
        got = np.array(gen.get_sequence(row))[max(lengths):]
        np.testing.assert_array_equal(got, want[row], err_msg=f"{name} --logits {logits} row {row}")


def test_io_and_ops(tmp_path):
    """onnxruntime-genai's decoder IO; attention is GroupQueryAttention,
    norms SimplifiedLayerNormalization; nothing of the Qualcomm form."""
    fx = Fixture("qwen3-bf16-gqa4")
    out = tmp_path / "out"
    export_ort(fx, out)
    m = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ins, outs = [i.name for i in m.graph.input], [o.name for o in m.graph.output]
    layers = json.load(open(os.path.join(fx.model, "config.json")))["num_hidden_layers"]
    kv = [f"past_key_values.{i}.{t}" for i in range(layers) for t in ("key", "value")]
    assert ins == ["input_ids", "attention_mask"] + kv
    assert outs == ["logits"] + [f"present.{i}.{t}" for i in range(layers) for t in ("key", "value")]
    logits = m.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in logits] == ["batch_size", "sequence_length", 128]
    ops = {n.op_type for n in m.graph.node}
    assert "GroupQueryAttention" in ops and "SimplifiedLayerNormalization" in ops
    assert not ops & {"CtxScatter", "CtxGather", "CustomRMSNorm", "Softmax"}, ops & {"CtxScatter", "CtxGather", "CustomRMSNorm", "Softmax"}
    assert sum(n.op_type == "GroupQueryAttention" for n in m.graph.node) == layers
    # Every residual add fused with the norm after it (within a layer and
    # across layers, into the final norm): no Add left but the RoPE's.
    assert sum(n.op_type == "SkipSimplifiedLayerNormalization" for n in m.graph.node) == 2 * layers


def test_last_token_logits_io(tmp_path):
    """--logits last: logits [batch_size, 1, vocab] with a fixed 1 (what
    onnxruntime-genai reads as a pruned model); nothing else changes."""
    fx = Fixture("llama-f32-base")
    export_ort(fx, tmp_path / "all")
    export_ort(fx, tmp_path / "last", "--logits", "last")
    graphs = {k: onnx.load(str(tmp_path / k / "model.onnx"), load_external_data=False).graph for k in ("all", "last")}
    dims = {k: [d.dim_param or d.dim_value for d in g.output[0].type.tensor_type.shape.dim] for k, g in graphs.items()}
    assert dims == {"all": ["batch_size", "sequence_length", 128], "last": ["batch_size", 1, 128]}
    assert [i.name for i in graphs["all"].input] == [i.name for i in graphs["last"].input]
    assert [o.name for o in graphs["all"].output] == [o.name for o in graphs["last"].output]
    assert {i.name for i in graphs["all"].initializer} == {i.name for i in graphs["last"].initializer}


@pytest.mark.parametrize("name", ["llama-f32-base", "qwen3moe-f32-top2-norm", "mistral-f32-sliding"])
def test_last_token_logits_chunked_prefill(name, tmp_path):
    """Prompts prefilled in chunks of 3 tokens (each chunk's last logits
    against the every-position export's at that token), then decoded:
    transformers' logits at the prompt's end and each decode step."""
    fx = Fixture(name)
    export_ort(fx, tmp_path / "all")
    export_ort(fx, tmp_path / "last", "--logits", "last")
    full, last = Session(str(tmp_path / "all" / "model.onnx")), Session(str(tmp_path / "last" / "model.onnx"))
    for row, n in enumerate(fx.ref["prompt_lengths"]):
        prompt = fx.ref["prompts"][row : row + 1, :n]
        every, _ = full.step(prompt, [n], full.empty(1))
        past = last.empty(1)
        for start in range(0, n, 3):
            chunk = prompt[:, start : start + 3]
            logits, past = last.step(chunk, [start + chunk.shape[1]], past)
            assert logits.shape == (1, 1, every.shape[-1])
            np.testing.assert_allclose(logits[0, 0], every[0, start + chunk.shape[1] - 1], atol=1e-5, rtol=0)
        got = [logits[0, 0]]
        for s, token in enumerate(fx.ref["decode_tokens"][row]):
            logits, past = last.step(np.array([[token]]), [n + s + 1], past)
            got.append(logits[0, 0])
        diff = np.abs(np.stack(got) - fx.ref["logits"][:, row]).max()
        assert diff <= TOLERANCE, f"{name} row {row}: max |Δlogits| {diff:.2e}"


@pytest.mark.parametrize("args,message", [
    (["--logits", "all"], "--logits all needs --target ort"),
    (["--target", "ort", "--logits", "first"], 'unknown --logits "first"'),
])
def test_logits_option_refusals(args, message, tmp_path):
    fx = Fixture("llama-f32-base")
    proc = subprocess.run([STRATA, "export", fx.model, "--out", str(tmp_path / "out"), *args], capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_genai_config_and_tokenizer_files(tmp_path):
    fx = Fixture("llama-f32-base")
    out = tmp_path / "out"
    export_ort(fx, out)
    with open(out / "genai_config.json") as f:
        cfg = json.load(f)
    with open(os.path.join(fx.model, "config.json")) as f:
        hf = json.load(f)
    dec = cfg["model"]["decoder"]
    assert cfg["model"]["type"] == "decoder" and dec["filename"] == "model.onnx"
    assert (dec["num_hidden_layers"], dec["num_attention_heads"], dec["num_key_value_heads"], dec["hidden_size"]) == (
        hf["num_hidden_layers"], hf["num_attention_heads"], hf["num_key_value_heads"], hf["hidden_size"])
    assert dec["head_size"] == hf["hidden_size"] // hf["num_attention_heads"]
    assert cfg["model"]["context_length"] == hf["max_position_embeddings"]
    assert dec["inputs"]["past_key_names"] == "past_key_values.%d.key" and dec["outputs"]["present_value_names"] == "present.%d.value"
    with open(os.path.join(fx.model, "generation_config.json")) as f:
        gen = json.load(f)
    assert cfg["model"]["eos_token_id"] == gen.get("eos_token_id", hf.get("eos_token_id"))
    st = os.lstat(out / "generation_config.json")
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1, "tokenizer files are copied as regular files"
    with open(out / "generation_config.json", "rb") as a, open(os.path.join(fx.model, "generation_config.json"), "rb") as b:
        assert a.read() == b.read()


def test_tokenizer_file_not_regular_is_refused(tmp_path):
    fx = Fixture("llama-f32-base")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in os.listdir(fx.model):
        os.link(os.path.join(fx.model, f), ckpt / f)
    os.mkdir(ckpt / "tokenizer.json")
    proc = subprocess.run([STRATA, "export", str(ckpt), "--out", str(tmp_path / "out"), "--target", "ort"], capture_output=True, text=True)
    assert proc.returncode == 1 and "tokenizer.json is not a regular file" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "model.onnx").exists()


@pytest.mark.parametrize("name", ["glm4lite-f32-qlora", "deepseek-f32-yarn-mtp", "gemma3-f32-sliding", "qwen35-f32-dense", "gptoss-mxfp4", "qwen3vl-f32-dense"])
def test_unmapped_architectures_are_refused(name, tmp_path):
    """Plugins whose layers do not map (GLM's MoE yet, latent attention,
    Gemma's norms, linear attention, sinks, vision) do not declare the
    target: the host refuses it, naming the plugin and its targets."""
    fx = Fixture(name)
    proc = subprocess.run([STRATA, "export", fx.model, "--out", str(tmp_path / "out"), "--target", "ort"], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "--target ort: plugin" in proc.stderr and "does not build that form" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", [["--layerwise"], ["--continuous-batching"], ["--ccl"]])
def test_options_without_a_place_are_refused(flag, tmp_path):
    fx = Fixture("llama-f32-base")
    proc = subprocess.run([STRATA, "export", fx.model, "--out", str(tmp_path / "out"), "--target", "ort", *flag], capture_output=True, text=True)
    assert proc.returncode == 2 and f"--target ort cannot be combined with {flag[0]}" in proc.stderr, proc.stderr


def test_default_export_over_an_ort_one_removes_its_files(tmp_path):
    """genai_config.json must not outlive the model it describes."""
    fx = Fixture("llama-f32-base")
    out = tmp_path / "out"
    export_ort(fx, out)
    assert (out / "genai_config.json").exists() and (out / "generation_config.json").exists()
    export(fx.model, out)
    assert not (out / "genai_config.json").exists() and not (out / "generation_config.json").exists()
