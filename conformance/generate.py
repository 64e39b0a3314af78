#!/usr/bin/env python3
"""Generates the conformance fixtures: tiny random checkpoints saved by Hugging
Face transformers, and the logits transformers computes for them.

Each fixture directory holds
  model/           the checkpoint exactly as save_pretrained wrote it
  reference.npz    prompts, decode tokens, and transformers' logits
  fixture.json     what the fixture covers and how to run it

The reference is computed by loading model/ back with transformers in float32
(bf16 checkpoints are upcast, as the exported graph casts them), one sequence
at a time without padding: a prefill of the prompt, then one token per decode
step with the KV cache. The ONNX side batches the same sequences with
padding, so the comparison also covers padding and per-row positions.

Needs the pinned generator environment (requirements-gen.txt); the tests only
read the committed output. Run: make fixtures
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers

import gen_deepseek
import gen_gemma3
import gen_glm
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

import gen_gptoss
import gen_mistral
import gen_olmo2
import gen_ort
import gen_phi3
import gen_quant
import gen_qwen35

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")

# Shared sizes: small enough to commit, big enough that every code path
# (GQA grouping, partial head dims, several layers) is exercised.
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
            rms_norm_eps=1e-5, initializer_range=0.25, bos_token_id=1, eos_token_id=2)

PROMPT_LENGTHS = [7, 4]  # batch of two, different lengths: padding and per-row positions
DECODE_STEPS = 4
CTX_LEN = 32


def llama3_rope(theta=10000.0):
    # original_max_position_embeddings small enough that the scaling changes
    # frequencies the test positions reach.
    return dict(rope_type="llama3", rope_theta=theta, factor=8.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=16)


FIXTURES_SPEC = {
    # name: (config overrides, dtype, options)
    "llama-f32-base": (dict(), "float32", {"bin_twin": True}),
    "llama-bf16-gqa2": (dict(num_key_value_heads=2), "bfloat16", {}),
    "llama-f32-tied-gqa4": (dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True), "float32", {}),
    "llama-f32-bias": (dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True), "float32", {}),
    "llama-f32-llama3-headdim": (dict(num_key_value_heads=2, head_dim=24, rope_parameters=llama3_rope(500000.0)),
                                 "float32", {"legacy_rope_config": True}),
    "llama-bf16-sharded": (dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                                tie_word_embeddings=True, rope_parameters=llama3_rope()),
                           "bfloat16", {"max_shard_size": "120KB", "bin_twin": True}),
}

# Qwen3-MoE: sizes as BASE plus experts; each fixture covers a routing
# option and an on-disk expert layout ("fused": mlp.experts.gate_up_proj
# [E, 2I, H] and down_proj [E, H, I], as transformers 5 holds them in memory
# and some re-saves store them; else per-expert keys, as save_pretrained
# writes). 12 experts make two-digit expert indices (10 sorts after 9).
QWEN3MOE = dict(moe_intermediate_size=32, head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)
QWEN3MOE_SPEC = {
    "qwen3moe-f32-top2-norm": (dict(), "float32", {}),
    "qwen3moe-bf16-top4-sparse": (dict(num_hidden_layers=4, num_experts=12, num_experts_per_tok=4, norm_topk_prob=False,
                                       decoder_sparse_step=2, mlp_only_layers=[0]), "bfloat16", {}),
    "qwen3moe-f32-fused-mixed": (dict(num_hidden_layers=3, mlp_only_layers=[1], num_key_value_heads=2), "float32",
                                 {"fused_experts": True}),
}

# Qwen3 dense (plugins/qwen3, the docs/plugins.md walk-through): q/k norms,
# biases, tied embeddings. Seeds are explicit so names that sort before the
# older fixtures leave their seeds unchanged.
QWEN3_SPEC = {
    "qwen3-f32-bias-tied": (dict(num_key_value_heads=2, head_dim=24, attention_bias=True, tie_word_embeddings=True),
                            "float32", {"seed": 2001}),
    "qwen3-bf16-gqa4": (dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=16), "bfloat16",
                        {"seed": 2002}),
}

import gen_qwen3vl  # noqa: E402  (imports this module's helpers)

ALL_SPEC = {**FIXTURES_SPEC, **QWEN3MOE_SPEC, **QWEN3_SPEC, **gen_gptoss.GPTOSS_SPEC, **gen_glm.GLM_SPEC,
            **gen_qwen3vl.QWEN3VL_SPEC, **gen_quant.QUANT_SPEC, **gen_mistral.MISTRAL_SPEC,
            **gen_olmo2.OLMO2_SPEC, **gen_gemma3.GEMMA3_SPEC,
            **gen_phi3.PHI3_SPEC, **gen_qwen35.QWEN35_SPEC, **gen_deepseek.DEEPSEEK_SPEC}

# The demo model: a bf16 checkpoint like the ones users have, with a greedy
# continuation recorded so the demo can show strata + ONNX Runtime agree.
DEMO = os.path.join(os.path.dirname(HERE), "examples", "tiny-llama")


def make_model(name, overrides, seed):
    if name.startswith(("deepseek-", "glm4lite-")):
        return gen_deepseek.make_model(name, overrides, seed, BASE)
    if name.startswith("glm-"):
        return gen_glm.make_model(overrides, seed, BASE)
    if name.startswith("mistral-"):
        return gen_mistral.make_model(overrides, seed, BASE)
    if name.startswith("olmo2-"):
        return gen_olmo2.make_model(overrides, seed, BASE)
    if name.startswith("phi3-"):
        return gen_phi3.make_model(overrides, seed, BASE)
    if name.startswith("gemma3-"):
        return gen_gemma3.make_model(overrides, seed, BASE)
    if name.startswith(("qwen35-", "qwen35moe-", "qwen3next-")):
        return gen_qwen35.make_model(name, overrides, seed, BASE)
    torch.manual_seed(seed)
    if name.startswith("qwen3-"):
        cfg = transformers.Qwen3Config(**{**BASE, **overrides})
        cfg.architectures = ["Qwen3ForCausalLM"]
        model = transformers.Qwen3ForCausalLM(cfg).eval()
    elif name.startswith("qwen3moe"):
        cfg = Qwen3MoeConfig(**{**BASE, **QWEN3MOE, **overrides})
        cfg.architectures = ["Qwen3MoeForCausalLM"]
        model = Qwen3MoeForCausalLM(cfg).eval()
    else:
        cfg = LlamaConfig(**{**BASE, **overrides})
        cfg.architectures = ["LlamaForCausalLM"]
        model = LlamaForCausalLM(cfg).eval()
    # Norm weights start at 1; randomise them so a swapped or missing norm shows.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            if n.endswith(".bias"):
                p.normal_(0.0, 0.2)
    return model


def save(model, out, dtype, options):
    model = model.to(getattr(torch, dtype))
    kwargs = {}
    if "max_shard_size" in options:
        kwargs["max_shard_size"] = options["max_shard_size"]
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    if options.get("legacy_rope_config"):
        legacy_rope_config(os.path.join(out, "config.json"))
    if options.get("bin_twin"):
        save_bin_twin(out, out + "-bin")
    if options.get("fused_experts"):
        fuse_experts(out)
    if options.get("rekey"):
        rekey(out, options["rekey"], lambda d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32))
    gen_glm.post_save(out, options)
    gen_deepseek.post_save(out, options)
    gen_mistral.post_save(out, options)
    gen_qwen35.post_save(out, options)


def fuse_experts(model_dir):
    """Rewrites the checkpoint with the experts fused, as transformers holds
    them in memory: loaded back by transformers, so the tensors are the very
    ones the reference is computed from."""
    from safetensors.torch import save_file

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    for name in os.listdir(model_dir):
        if name.endswith(".safetensors") or name == "model.safetensors.index.json":
            os.remove(os.path.join(model_dir, name))
    save_file(state, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})


@torch.no_grad()
def rekey(model_dir, pairs, load):
    """Rewrites model_dir's safetensors in another key layout, as other
    transformers versions or tools save the same model: each key starting
    with a `from` of pairs ([from, to], the first that matches) gets its
    `to` instead. Checked: load (transformers) reads the new layout with no
    key missing or left over, into the very logits it gave before."""
    from safetensors.torch import load_file, save_file

    ids = torch.tensor([[5, 9, 22, 40, 7, 3]])
    saved = load(model_dir).eval()
    before = saved(input_ids=ids).logits
    path = os.path.join(model_dir, "model.safetensors")
    assert os.path.exists(path) and not os.path.exists(path + ".index.json"), "rekey: one model.safetensors"
    state, renamed = {}, 0
    for k, v in load_file(path).items():
        for src, dst in pairs:
            if k.startswith(src):
                k, renamed = dst + k[len(src):], renamed + 1
                break
        assert k not in state, f"rekey: two tensors become {k}"
        state[k] = v
    assert renamed, f"rekey: no key starts with any of {[p[0] for p in pairs]}"
    save_file(state, path, metadata={"format": "pt"})
    _, info = type(saved).from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], f"rekey: transformers does not load {pairs}: {info}"
    after = load(model_dir).eval()(input_ids=ids).logits
    assert torch.equal(before, after), f"rekey: transformers reads {pairs} into other logits"


def save_bin_twin(src, dest):
    """The same weights as PyTorch pickles (pytorch_model*.bin + index), the
    way transformers 4.x saved them with safe_serialization=False: torch.save
    of each shard's state dict. (transformers 5 no longer writes .bin.) The
    reference logits are the twin's too."""
    from safetensors.torch import load_file

    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(src):
        if name.endswith(".json") and name != "model.safetensors.index.json":
            shutil.copy(os.path.join(src, name), dest)
    index = os.path.join(src, "model.safetensors.index.json")
    if not os.path.exists(index):
        torch.save(load_file(os.path.join(src, "model.safetensors")), os.path.join(dest, "pytorch_model.bin"))
        return
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    renamed, total = {}, 0
    for shard in sorted(set(weight_map.values())):
        tensors = load_file(os.path.join(src, shard))
        name = shard.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
        torch.save(tensors, os.path.join(dest, name))
        renamed.update({k: name for k in tensors})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(dest, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": renamed}, f, indent=2, sort_keys=True)


def legacy_rope_config(path):
    """Rewrites rope_parameters as the ≤4.x keys (rope_theta, rope_scaling):
    checkpoints on the Hub still carry them, and transformers still reads them."""
    with open(path) as f:
        cfg = json.load(f)
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


@torch.no_grad()
def reference(model_dir, prompts, decode_tokens):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    steps = [[] for _ in range(1 + DECODE_STEPS)]
    for b, prompt in enumerate(prompts):
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        steps[0].append(out.logits[0, -1].numpy())
        past = out.past_key_values
        for s in range(DECODE_STEPS):
            out = model(input_ids=torch.tensor([[decode_tokens[b][s]]]), past_key_values=past, use_cache=True)
            steps[s + 1].append(out.logits[0, -1].numpy())
            past = out.past_key_values
    return np.stack([np.stack(s) for s in steps]).astype(np.float32)  # [steps, batch, vocab]


@torch.no_grad()
def greedy(model_dir, prompts, n):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    out = []
    for prompt in prompts:
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        out.append(ids[0, len(prompt):].tolist())
    return out


def generate_fixture(dest, name, overrides, dtype, options, seed, with_greedy=False):
    rng = np.random.default_rng(seed)
    vocab = BASE["vocab_size"]
    prompts = [rng.integers(3, vocab, size=n).tolist() for n in PROMPT_LENGTHS]
    decode_tokens = [rng.integers(3, vocab, size=DECODE_STEPS).tolist() for _ in PROMPT_LENGTHS]

    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    model_dir = os.path.join(dest, "model")
    save(make_model(name, overrides, seed), model_dir, dtype, options)

    logits = reference(model_dir, prompts, decode_tokens)
    arrays = dict(logits=logits, prompt_lengths=np.array(PROMPT_LENGTHS, dtype=np.int64),
                  prompts=pad(prompts), decode_tokens=np.array(decode_tokens, dtype=np.int64))
    meta = dict(name=name, checkpoint_dtype=dtype, ctx_len=CTX_LEN, decode_steps=DECODE_STEPS,
                config_overrides=overrides, options=options, seed=seed,
                transformers=transformers.__version__, torch=torch.__version__)
    if with_greedy:
        arrays["greedy"] = np.array(greedy(model_dir, prompts, 8), dtype=np.int64)
        meta["greedy_tokens"] = 8
    np.savez_compressed(os.path.join(dest, "reference.npz"), **arrays)
    with open(os.path.join(dest, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: {dtype}, {sum(os.path.getsize(os.path.join(model_dir, x)) for x in os.listdir(model_dir))} bytes")


def generate_transforms(dest, seed=11):
    """Random MXFP4 blocks/scales and FP8 weights/scales, dequantised by
    transformers' own functions (convert_moe_packed_tensors, Fp8Dequantize),
    with the strata weight expression that must reproduce each bit for bit."""
    from safetensors.torch import save_file
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(seed)
    tensors, cases = {}, []

    def fp8_bytes(shape, dtype):
        b = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        if dtype == torch.float8_e4m3fn:
            b = torch.where((b & 0x7F) == 0x7F, b & 0xFE, b)  # no NaN codes
        else:
            b = torch.where((b & 0x7C) == 0x7C, b & 0x7B, b)  # no Inf/NaN codes
        return b.view(dtype)

    def add(name, expr, expected, **inputs):
        for k, v in inputs.items():
            tensors[f"{name}.{k}"] = v.contiguous()
        tensors[f"{name}.expected"] = expected.contiguous()
        cases.append({"name": name, "expr": expr, "expected": f"{name}.expected"})

    def key(name, k):
        return {"key": f"{name}.{k}"}

    for dtype, label in [(torch.bfloat16, "bfloat16"), (torch.float32, "float32")]:
        name = f"mxfp4_{label}"
        blocks = torch.randint(0, 256, (2, 6, 3, 16), generator=g, dtype=torch.uint8)
        scales = torch.randint(112, 140, (2, 6, 3), generator=g, dtype=torch.uint8)
        scales[0, 0, 0], scales[1, 5, 2] = 0, 254  # extreme exponents
        expected = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        expr = {"op": "transpose", "ints": [0, 2, 1], "args": [{"op": "mxfp4_dequant", "args": [key(name, "blocks"), key(name, "scales")]}]}
        if label == "bfloat16":
            expr = {"op": "cast", "to": "bfloat16", "args": [expr]}
        add(name, expr, expected, blocks=blocks, scales=scales)

    deq = Fp8Dequantize(None)
    fp8_cases = [
        ("fp8_e4m3_block128", (256, 128), torch.float8_e4m3fn, lambda: torch.rand(2, 1, generator=g) + 0.01),
        ("fp8_e4m3_experts", (2, 64, 96), torch.float8_e4m3fn, lambda: torch.rand(2, 2, 3, generator=g) + 0.01),
        ("fp8_e4m3_per_tensor", (32, 48), torch.float8_e4m3fn, lambda: torch.rand((), generator=g) + 0.01),
        ("fp8_e5m2_block", (32, 64), torch.float8_e5m2, lambda: torch.rand(1, 2, generator=g) + 0.01),
        ("fp8_e4m3_bf16_scale", (64, 32), torch.float8_e4m3fn, lambda: (torch.rand(2, 1, generator=g) + 0.01).to(torch.bfloat16)),
        ("fp8_e4m3_ue8m0_scale", (64, 64), torch.float8_e4m3fn, lambda: torch.randint(110, 135, (2, 2), generator=g, dtype=torch.uint8)),
    ]
    for name, shape, dtype, make_scale in fp8_cases:
        weight, scale = fp8_bytes(shape, dtype), make_scale()
        expected = deq._dequantize_one(weight, scale)
        expr = {"op": "fp8_dequant", "args": [key(name, "weight"), key(name, "scale")]}
        if expected.dtype != torch.float32:
            expr = {"op": "cast", "to": "bfloat16", "args": [expr]}
        add(name, expr, expected, weight=weight, scale=scale)

    os.makedirs(dest, exist_ok=True)
    save_file(tensors, os.path.join(dest, "inputs.safetensors"))
    with open(os.path.join(dest, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    print(f"transforms: {len(cases)} cases, {os.path.getsize(os.path.join(dest, 'inputs.safetensors'))} bytes")


def generate_routers(dest, seed=13):
    """Each MoE router kind of the SDK, run by transformers' own router module
    (Qwen3MoeTopKRouter, GptOssTopKRouter, Glm4MoeTopkRouter) on random
    tokens: inputs, router weights, and the expert weights and indices it
    picks. The models' fixtures exercise softmax_topk end to end; these pin
    the kinds whose plugins come later."""
    from safetensors.torch import save_file
    from transformers import Glm4MoeConfig, GptOssConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    g = torch.Generator().manual_seed(seed)
    hidden, tokens = 32, 9
    tensors, cases = {}, []

    def randomize(router):
        for name, p in router.named_parameters():
            p.data = torch.randn(p.shape, generator=g) * (1.0 if name == "weight" else 0.5)
        for name, b in router.named_buffers():
            b.data = torch.rand(b.shape, generator=g) * 0.2  # e_score_correction_bias: small, shifts choices
        return router

    def add(name, kind, router, **params):
        x = torch.randn(tokens, hidden, generator=g) * 0.3
        with torch.no_grad():
            _, weights, indices = router(x)
        inputs = {"x": x, "weight": router.weight}
        if getattr(router, "bias", None) is not None:
            inputs["bias"] = router.bias
        if hasattr(router, "e_score_correction_bias"):
            inputs["correction_bias"] = router.e_score_correction_bias
        for k, v in inputs.items():
            tensors[f"{name}.{k}"] = v.detach().float().contiguous()
        tensors[f"{name}.expected_weights"] = weights.detach().float().contiguous()
        tensors[f"{name}.expected_indices"] = indices.to(torch.int64).contiguous()
        cases.append({"name": name, "kind": kind, "experts": router.num_experts, "top_k": router.top_k,
                      "inputs": sorted(inputs), **params})

    for norm in (True, False):
        cfg = Qwen3MoeConfig(hidden_size=hidden, num_experts=12, num_experts_per_tok=4, norm_topk_prob=norm)
        add(f"qwen3moe_norm_{str(norm).lower()}", "softmax_topk", randomize(Qwen3MoeTopKRouter(cfg)), normalize=norm)
    cfg = GptOssConfig(hidden_size=hidden, num_local_experts=16, num_experts_per_tok=4)
    add("gptoss_top4_of_16", "topk_softmax", randomize(GptOssTopKRouter(cfg)))
    for name, groups, keep, k, norm, scale in [("glm_grouped_norm", 4, 2, 4, True, 2.5),
                                               ("glm_one_group_raw", 1, 1, 3, False, 1.0)]:
        cfg = Glm4MoeConfig(hidden_size=hidden, n_routed_experts=16, num_experts_per_tok=k, n_group=groups,
                            topk_group=keep, norm_topk_prob=norm, routed_scaling_factor=scale)
        add(name, "sigmoid_grouped", randomize(Glm4MoeTopkRouter(cfg)), normalize=norm, groups=groups,
            topk_groups=keep, scale=scale)

    os.makedirs(dest, exist_ok=True)
    save_file(tensors, os.path.join(dest, "inputs.safetensors"))
    with open(os.path.join(dest, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"routers: {len(cases)} cases")


def pad(prompts):
    width = max(len(p) for p in prompts)
    return np.array([p + [0] * (width - len(p)) for p in prompts], dtype=np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="fixtures to (re)generate; default: all, and the demo model")
    args = ap.parse_args()
    torch.set_num_threads(1)  # deterministic reductions
    extras = ["demo", "transforms", "routers"]
    names = args.names or list(ALL_SPEC) + extras
    unknown = set(names) - set(ALL_SPEC) - set(extras)
    if unknown:
        ap.error(f"unknown fixture(s) {sorted(unknown)}; known: {sorted(ALL_SPEC)}, {', '.join(extras)}")
    # Seeds follow the sorted names, so adding an architecture that sorts
    # after the others leaves their fixtures unchanged.
    older = sorted(set(ALL_SPEC) - set(QWEN3_SPEC) - set(gen_gptoss.GPTOSS_SPEC) - set(gen_glm.GLM_SPEC)
                   - set(gen_qwen3vl.QWEN3VL_SPEC) - set(gen_quant.QUANT_SPEC) - set(gen_mistral.MISTRAL_SPEC)
                   - set(gen_olmo2.OLMO2_SPEC) - set(gen_gemma3.GEMMA3_SPEC)
                   - set(gen_phi3.PHI3_SPEC) - set(gen_qwen35.QWEN35_SPEC) - set(gen_deepseek.DEEPSEEK_SPEC))
    gen_qwen3vl.generate(names)
    gen_quant.generate(names, sys.modules[__name__])
    for name in sorted(set(ALL_SPEC) - set(gen_qwen3vl.QWEN3VL_SPEC) - set(gen_quant.QUANT_SPEC)):
        if name in names:
            overrides, dtype, options = ALL_SPEC[name]
            seed = options.get("seed", 1000 + older.index(name) if name in older else None)
            if name in gen_qwen35.QWEN35_SPEC and options.get("vision_prompts"):
                gen_qwen35.generate_vision_fixture(os.path.join(FIXTURES, name), name, overrides, dtype, options, BASE)
                continue
            if name in gen_gptoss.GPTOSS_SPEC:
                gen_gptoss.generate_fixture(os.path.join(FIXTURES, name), name, overrides, dtype, options, seed,
                                            sys.modules[__name__])
                continue
            generate_fixture(os.path.join(FIXTURES, name), name, overrides, dtype, options, seed=seed)
    gen_glm.generate_extras(FIXTURES, names)
    gen_deepseek.generate_extras(FIXTURES, names)
    gen_qwen35.generate_extras(FIXTURES, names)
    gen_mistral.generate_extras(FIXTURES, names)
    gen_ort.generate_extras(FIXTURES, names)
    if "transforms" in names:
        generate_transforms(os.path.join(FIXTURES, "transforms"))
    if "routers" in names:
        generate_routers(os.path.join(FIXTURES, "routers"))
    if "demo" in names:
        generate_fixture(DEMO, "tiny-llama", dict(num_attention_heads=8, num_key_value_heads=2), "bfloat16", {},
                         seed=7, with_greedy=True)
    # The tests take the fixture list from here and fail on any that is missing.
    manifest = sorted(ALL_SPEC)
    with open(os.path.join(FIXTURES, "manifest.json"), "w") as f:
        json.dump({"fixtures": manifest}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
