"""Real clients of `strata convert` output: transformers loads every converted
checkpoint and must give the source's logits — exactly where the dtype is
unchanged, within the dtype's rounding otherwise; its FineGrainedFP8 loader
(with accelerate) reads fp8-block output and compressed-tensors reads
fp8-dynamic output, each within FP8 error of the source and equal to a
torch re-implementation of the same quantiser. MTP fixtures are made here by
file surgery, in all three conventions. Every quantised fixture (fine-grained
FP8, compressed-tensors, ModelOpt) dequantised to float32 gives the fixture's
reference logits, prefill and decode.

Needs bin/strata (make build) and requirements-client.txt (make
test-client installs it into .venv/client). Nothing is skipped: a missing
binary, package or fixture fails.
"""

import json
import math
import os
import shutil
import subprocess

import numpy as np
import pytest
import safetensors.torch as st
import torch
import transformers
from transformers import AutoModelForCausalLM

import accelerate  # noqa: F401  the FP8 loader needs it
import compressed_tensors  # noqa: F401  the fp8-dynamic loader needs it

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "conformance", "fixtures")
STRATA = os.environ.get("STRATA", os.path.join(ROOT, "bin", "strata"))

IDS = torch.tensor([[3, 17, 42, 99, 5, 64, 7, 120, 11, 2], [8, 1, 77, 23, 100, 6, 50, 31, 90, 4]])
TORCH_DTYPE = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
FP8_MAX = 448.0


def fixture(name):
    path = os.path.join(FIXTURES, name, "model")
    if not os.path.isdir(path):
        pytest.fail(f"fixture {path} is missing; run `make fixtures`")
    return path


def convert(src, out, *args):
    if not os.access(STRATA, os.X_OK):
        pytest.fail(f"{STRATA} is missing: build it first (make build)")
    proc = subprocess.run([STRATA, "convert", str(src), "--out", str(out), *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"strata convert failed:\n{proc.stderr}"
    return out


def load(path):
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


def params(model):
    return {n: p.detach() for n, p in model.named_parameters()}


def with_params(src, new):
    """The source model with some parameters replaced (the reference)."""
    model = load(src)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in new:
                p.copy_(new[n])
    return model


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def rel_norm(a, b):
    """‖a − b‖ / ‖b‖ over all logits."""
    return ((a - b).norm() / b.norm()).item()


def tensors(out):
    """Every tensor of a converted checkpoint, through its index."""
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        index = json.load(f)
    ts = {}
    for shard in sorted(set(index["weight_map"].values())):
        ts.update(st.load_file(os.path.join(out, shard)))
    assert set(ts) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in ts.values())
    return ts


def source_tensors(src):
    ts = {}
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            ts.update(st.load_file(os.path.join(src, f)))
    return ts


# --- dtype changes and copies -------------------------------------------------

DTYPE_CASES = [
    ("llama-f32-base", "bfloat16"),
    ("llama-bf16-gqa2", "float16"),
    ("llama-bf16-sharded", None),
    ("llama-f32-tied-gqa4", "float16"),
    ("qwen3moe-f32-top2-norm", "bfloat16"),
    ("qwen3moe-f32-fused-mixed", "bfloat16"),
    ("qwen3moe-bf16-top4-sparse", "float32"),
]
# max |Δlogits| / max |logits| against the source, by dtype: bf16 keeps 8
# bits of mantissa, fp16 11; float32 and unchanged are exact.
DTYPE_TOLERANCE = {"bfloat16": 0.05, "float16": 0.01, "float32": 0.0, None: 0.0}


@pytest.mark.parametrize("name,dtype", DTYPE_CASES, ids=[f"{n}-{d or 'as-stored'}" for n, d in DTYPE_CASES])
def test_dtype_conversion_gives_source_logits(tmp_path, name, dtype):
    src = fixture(name)
    out = convert(src, tmp_path / "out", *(["--dtype", dtype] if dtype else []))
    source, converted = load(src), load(out)
    want = {}
    for n, p in params(source).items():
        q = params(converted)[n]
        rounded = p.to(TORCH_DTYPE[dtype]).float() if dtype else p
        assert torch.equal(q, rounded), f"{n}: not the source rounded as torch rounds to {dtype}"
        want[n] = rounded
    got = logits(converted)
    # Same weights as torch's rounding, same compute: the same logits, exactly.
    assert torch.equal(got, logits(with_params(src, want)))
    assert rel(got, logits(source)) <= DTYPE_TOLERANCE[dtype]
    if dtype is None:
        s, o = source_tensors(src), tensors(out)
        assert set(s) == set(o) and all(torch.equal(s[k], o[k]) for k in s)


# --- MXFP4 (gpt-oss) --------------------------------------------------------

FP4 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def mxfp4_quantize(w):
    """w [E, rows, cols] -> blocks [E, rows, cols/32, 16] U8, scales [E, rows, cols/32] U8."""
    e, rows, cols = w.shape
    g = w.reshape(e, rows, cols // 32, 32)
    amax = g.abs().amax(-1).clamp(min=1e-30)
    exp = torch.ceil(torch.log2(amax / 6)).clamp(-127, 127)
    scaled = g / torch.exp2(exp)[..., None]
    codes = (scaled[..., None] - FP4).abs().argmin(-1).to(torch.uint8)  # nearest E2M1
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exp + 127).to(torch.uint8)


def mxfp4_dequantize(blocks, scales):
    lo, hi = FP4[(blocks & 0x0F).long()], FP4[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], -1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.exp2(scales.float() - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1)


def gptoss_mxfp4(tmp_path):
    """A tiny gpt-oss saved by transformers, its experts then packed as the
    Hub release packs them (MXFP4 *_blocks/*_scales, [E, out, in/32, 16])."""
    cfg = transformers.GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=8, max_position_embeddings=128,
                                    layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(cfg).to(torch.bfloat16).eval()
    ref = tmp_path / "reference"
    src = tmp_path / "mxfp4"
    packed = {}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales = mxfp4_quantize(p.float().transpose(1, 2))  # Hub layout is [E, out, in]
                p.copy_(mxfp4_dequantize(blocks, scales).transpose(1, 2))  # exactly representable values
                packed[n] = (blocks, scales)
    model.save_pretrained(ref)
    shutil.copytree(ref, src)
    ts = st.load_file(os.path.join(src, "model.safetensors"))
    for n, (blocks, scales) in packed.items():
        del ts[n]
        ts[n + "_blocks"], ts[n + "_scales"] = blocks.contiguous(), scales.contiguous()
    st.save_file(ts, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return ref, src


def test_mxfp4_dequantised_to_bf16_gives_source_logits(tmp_path):
    ref, src = gptoss_mxfp4(tmp_path)
    out = convert(src, tmp_path / "out", "--dtype", "bfloat16")
    with open(os.path.join(out, "config.json")) as f:
        assert "quantization_config" not in json.load(f)
    o, r = tensors(out), st.load_file(os.path.join(ref, "model.safetensors"))
    assert set(o) == set(r)
    for k in r:
        assert o[k].dtype == r[k].dtype and torch.equal(o[k], r[k]), k
    # transformers' own MXFP4 loader (it dequantises on CPU) reads the source.
    source = load(src)
    assert torch.equal(logits(load(out)), logits(source))


# --- FP8 --------------------------------------------------------------------

def fp8_block_reference(w):
    """transformers' Fp8Quantize, then FineGrainedFP8's dequantisation, in torch."""
    rows, cols = w.shape
    br, bc = math.ceil(rows / 128), math.ceil(cols / 128)
    pad = torch.zeros(br * 128, bc * 128)
    pad[:rows, :cols] = w.float()
    blocks = pad.reshape(br, 128, bc, 128)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, FP8_MAX / amax, torch.ones_like(amax))
    q = torch.clamp(blocks * scale[:, None, :, None], -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    deq = q.float() * (1.0 / scale)[:, None, :, None]
    return deq.reshape(br * 128, bc * 128)[:rows, :cols]


def fp8_channel_reference(w, scale_dtype):
    """compressed-tensors FP8_DYNAMIC weights: symmetric per-channel min-max."""
    w = w.float()
    scale = (w.abs().amax(dim=1, keepdim=True) / FP8_MAX).to(scale_dtype).float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(w / scale, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.float() * scale


def quantize_activations_per_token(model, excluded):
    """FP8_DYNAMIC's input activations: per token, symmetric, scale = amax / 448."""

    def hook(module, args):
        x = args[0]
        scale = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=torch.finfo(torch.float32).eps)
        q = torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return (q.to(x.dtype) * scale,)

    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and n not in excluded:
            m.register_forward_pre_hook(hook)


# ‖Δlogits‖ / ‖logits‖ against the unquantised source: what E4M3's 3
# mantissa bits (relative step 1/8) allow on these tiny random models, whose
# wide initialisation amplifies the noise — weights only for fp8-block (as
# transformers runs it on CPU), weights and every token's activations for
# fp8-dynamic (where MoE routing decisions also flip). The exact checks are
# the comparisons with the torch re-implementation of each quantiser.
FP8_TOLERANCE = {"fp8-block": 0.25, "fp8-dynamic": 0.5}


FP8_CASES = [
    ("llama-f32-base", "fp8-block"),
    ("llama-bf16-sharded", "fp8-block"),
    ("qwen3moe-f32-top2-norm", "fp8-block"),
    ("qwen3moe-f32-fused-mixed", "fp8-block"),
    ("llama-f32-base", "fp8-dynamic"),
    ("llama-bf16-gqa2", "fp8-dynamic"),
    ("llama-f32-tied-gqa4", "fp8-dynamic"),
    ("llama-f32-tied-gqa4", "fp8-block"),
    ("qwen3moe-f32-top2-norm", "fp8-dynamic"),
    ("qwen3moe-f32-fused-mixed", "fp8-dynamic"),
]


def dequantize(ts, k, scheme):
    """A converted FP8 tensor times its scale, as the format defines it."""
    q = ts[k].float()
    if scheme == "fp8-block":
        inv = ts[k + "_scale_inv"].float()
        full = inv.repeat_interleave(128, 0).repeat_interleave(128, 1)
        return q * full[: q.shape[0], : q.shape[1]]
    return q * ts[k.removesuffix("weight") + "weight_scale"].float()


def reference_dir(tmp_path, src, ts, scheme):
    """The source with every tensor the conversion quantised replaced by the
    torch re-implementation of the quantiser (float32): what transformers must
    compute from the converted checkpoint."""
    ref = tmp_path / "reference"
    shutil.copytree(src, ref)
    for f in os.listdir(ref):
        if not f.endswith(".safetensors"):
            continue
        s = st.load_file(os.path.join(ref, f))
        for k, w in s.items():
            if ts[k].dtype == torch.float8_e4m3fn:
                want = fp8_block_reference(w) if scheme == "fp8-block" else fp8_channel_reference(w, w.dtype)
                assert torch.allclose(dequantize(ts, k, scheme), want, rtol=0, atol=1e-6 * want.abs().max().item()), k
                s[k] = want.contiguous()
        st.save_file(s, os.path.join(ref, f), metadata={"format": "pt"})
    return ref


@pytest.mark.parametrize("name,scheme", FP8_CASES, ids=[f"{n}-{s}" for n, s in FP8_CASES])
def test_fp8_loads_in_transformers_within_fp8_error(tmp_path, name, scheme):
    src = fixture(name)
    out = convert(src, tmp_path / "out", "--quantize", scheme)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    ts = tensors(out)
    quantized = [k for k, v in ts.items() if v.dtype == torch.float8_e4m3fn]
    assert quantized and all(".layers." in k and k.endswith("proj.weight") for k in quantized)
    for k, v in ts.items():  # routers, norms, embeddings, head: as stored
        if k not in quantized and not k.endswith(("_scale_inv", "weight_scale")):
            assert v.dtype in (torch.float32, torch.bfloat16), k
    if scheme == "fp8-block":
        assert qc["quant_method"] == "fp8" and qc["weight_block_size"] == [128, 128]
        excluded = qc["modules_to_not_convert"]
    else:
        from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

        parsed = QuantizationConfig.model_validate(qc)  # the library's own schema
        preset = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
        group = parsed.config_groups["group_0"]
        # llm-compressor records the weight observer it ran ("minmax"); the
        # preset leaves it unset.
        assert group.weights.model_copy(update={"observer": None}) == preset.weights
        assert group.input_activations == preset.input_activations
        assert parsed.format == "float-quantized" and parsed.quant_method == "compressed-tensors"
        excluded = qc["ignore"]
    assert "lm_head" in excluded  # tied or not: the module exists
    assert "model.embed_tokens" in excluded and "model" not in excluded
    for k in ts:
        if k.endswith("mlp.gate.weight"):
            assert k.removesuffix(".weight") in excluded, f"router {k} not excluded"
    ref = reference_dir(tmp_path, src, ts, scheme)
    converted = load(out)  # FineGrainedFP8 (dequantised on CPU) / compressed-tensors
    got = logits(converted)  # compressed-tensors decompresses on the first forward
    reference = load(ref)
    for n, p in params(reference).items():
        assert torch.allclose(params(converted)[n], p, rtol=0, atol=1e-6 * max(p.abs().max().item(), 1e-30)), n
    if scheme == "fp8-dynamic":
        # compressed-tensors quantises each token's activations on the fly.
        quantize_activations_per_token(reference, excluded)
    assert torch.allclose(got, logits(reference), atol=1e-4, rtol=0)
    err = rel_norm(got, logits(load(src)))
    print(f"{name} {scheme}: ‖Δlogits‖/‖logits‖ = {err:.4f} vs the source, {rel_norm(got, logits(reference)):.2e} vs the reference")
    assert err <= FP8_TOLERANCE[scheme]


# --- MTP, three conventions, by file surgery ----------------------------------

def mtp_layer(prefix, hidden, vocab, gen):
    shapes = {"enorm.weight": (hidden,), "hnorm.weight": (hidden,), "eh_proj.weight": (hidden, 2 * hidden),
              "shared_head.norm.weight": (hidden,), "shared_head.head.weight": (vocab, hidden),
              "self_attn.q_proj.weight": (hidden, hidden), "mlp.gate_proj.weight": (96, hidden),
              "mlp.down_proj.weight": (hidden, 96), "input_layernorm.weight": (hidden,)}
    return {prefix + k: torch.randn(s, generator=gen) for k, s in shapes.items()}


def with_mtp(tmp_path, convention):
    """llama-f32-base or llama-bf16-sharded plus MTP weights, as DeepSeek-V3
    (inlined), GLM-4.7 repacks (separate file) or Qwen3-Next (indexed) ship them."""
    name = "llama-bf16-sharded" if convention != "inlined" else "llama-f32-base"
    src = tmp_path / f"src-{convention}"
    shutil.copytree(fixture(name), src)
    with open(src / "config.json") as f:
        config = json.load(f)
    n, hidden, vocab = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
    gen = torch.Generator().manual_seed(5)
    dtype = torch.float32 if name == "llama-f32-base" else torch.bfloat16
    if convention == "inlined":
        config["num_nextn_predict_layers"] = 1
        mtp = {k: v.to(dtype) for k, v in mtp_layer(f"model.layers.{n}.", hidden, vocab, gen).items()}
        ts = st.load_file(src / "model.safetensors")
        ts.update(mtp)
        st.save_file(ts, src / "model.safetensors", metadata={"format": "pt"})
        prefix = f"model.layers.{n}"
    elif convention == "separate-file":
        mtp = {k: v.to(dtype) for k, v in mtp_layer(f"model.layers.{n}.", hidden, vocab, gen).items()}
        st.save_file(mtp, src / "mtp.safetensors", metadata={"format": "pt"})  # not in the index
        prefix = f"model.layers.{n}"
    else:
        mtp = mtp_layer("mtp.layers.0.", hidden, vocab, gen)
        mtp["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=gen)
        mtp["mtp.norm.weight"] = torch.randn(hidden, generator=gen)
        mtp = {k: v.to(dtype) for k, v in mtp.items()}
        shard = "model-00002-of-00002.safetensors"
        ts = st.load_file(src / shard)
        ts.update(mtp)
        st.save_file(ts, src / shard, metadata={"format": "pt"})
        with open(src / "model.safetensors.index.json") as f:
            index = json.load(f)
        index["weight_map"].update({k: shard for k in mtp})
        with open(src / "model.safetensors.index.json", "w") as f:
            json.dump(index, f)
        prefix = "mtp"
    with open(src / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    return name, src, mtp, prefix


@pytest.mark.parametrize("convention", ["inlined", "separate-file", "indexed"])
@pytest.mark.parametrize("scheme", ["fp8-block", "fp8-dynamic"])
def test_mtp_carried_whole_unquantised_and_excluded(tmp_path, convention, scheme):
    name, src, mtp, prefix = with_mtp(tmp_path, convention)
    out = convert(src, tmp_path / "out", "--quantize", scheme)
    ts = tensors(out)
    for k, v in mtp.items():
        assert k in ts, f"MTP tensor {k} lost"
        assert ts[k].dtype == v.dtype and torch.equal(ts[k], v), f"MTP tensor {k} changed"
        assert k.removesuffix("weight") + "weight_scale_inv" not in ts and k + "_scale" not in ts
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    excluded = qc.get("modules_to_not_convert") or qc.get("ignore")
    want = prefix if scheme == "fp8-block" else "re:^" + prefix.replace(".", r"\.") + r"\."
    assert want in excluded and "model" not in excluded
    with open(os.path.join(out, "convert-report.json")) as f:
        report = json.load(f)
    assert {t["key"] for t in report["tensors"] if t.get("mtp")} == set(mtp)
    # The backbone still loads and computes what the same conversion without MTP does.
    plain = convert(fixture(name), tmp_path / "plain", "--quantize", scheme)
    assert torch.equal(logits(load(out)), logits(load(plain)))


# --- quantised sources: every format host/quant reads -------------------------

# Committed fixtures (conformance/gen_quant.py), each with the logits of
# transformers loading it (or, where transformers cannot, of the float32
# formula: fixture.json "reference").
QUANT_SOURCES = [
    "llama-fp8-block", "llama-fp8-block32", "qwen3moe-fp8-block",
    "llama-ct-fp8-channel", "llama-ct-fp8-tensor", "llama-ct-fp8-block", "llama-ct-fp8-dynamic",
    "llama-ct-w4a16-group", "llama-ct-w4a16-asym", "llama-ct-w8a16-channel", "qwen3moe-ct-w4a16",
    "llama-modelopt-nvfp4", "llama-modelopt-fp8",
]


@torch.no_grad()
def fixture_logits(model, arrays):
    """generate.py's reference(): each prompt prefilled, then its decode
    tokens one at a time through the cache; [steps, batch, vocab]."""
    steps = [[] for _ in range(1 + arrays["decode_tokens"].shape[1])]
    for b, n in enumerate(arrays["prompt_lengths"]):
        prompt = arrays["prompts"][b][:n].tolist()
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        steps[0].append(out.logits[0, -1].numpy())
        past = out.past_key_values
        for s, tok in enumerate(arrays["decode_tokens"][b].tolist()):
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            steps[s + 1].append(out.logits[0, -1].numpy())
            past = out.past_key_values
    return np.stack([np.stack(s) for s in steps]).astype(np.float32)


@pytest.mark.parametrize("name", QUANT_SOURCES)
def test_quantised_source_dequantised_gives_reference_logits(tmp_path, name):
    src = fixture(name)
    out = convert(src, tmp_path / "out", "--dtype", "float32")
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert not os.path.exists(os.path.join(out, "hf_quant_config.json"))
    ts = tensors(out)
    for k, v in ts.items():  # one float32 tensor per weight, under its logical key
        assert v.dtype == torch.float32, k
        assert not k.endswith(("_scale", "_scale_inv", "_scale_2", "_packed", "_zero_point", "_shape")), k
    with open(os.path.join(out, "convert-report.json")) as f:
        report = json.load(f)
    assert report["source_quantization"]["weights"] == report["summary"]["dequantized"] > 0
    for t in report["tensors"]:  # the stored parts are consumed, never copied
        if t["dtype"] not in ("F32", "BF16"):
            assert t["action"] in ("dequantized", "dropped"), t
    with open(os.path.join(FIXTURES, name, "fixture.json")) as f:
        meta = json.load(f)
    with open(os.path.join(src, "config.json")) as f:
        source_qc = json.load(f)["quantization_config"]
    arrays = np.load(os.path.join(FIXTURES, name, "reference.npz"))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager").eval()
    if name == "llama-ct-fp8-dynamic":
        # The source also quantises each Linear's input per token (FP8_DYNAMIC),
        # as transformers + compressed-tensors computes it: a float checkpoint
        # does not, so the reference needs the same activation quantisation.
        quantize_activations_per_token(model, source_qc["ignore"])
    got = fixture_logits(model, arrays)
    want = arrays["logits"]
    err = float(np.abs(got - want).max())
    source = meta.get("reference", "transformers")[:48]
    print(f"{name}: max |Δlogits| {err:.3g} vs the fixture's reference ({source}), logit scale {np.abs(want).max():.3g}")
    assert err <= 1e-4
