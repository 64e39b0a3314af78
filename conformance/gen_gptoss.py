"""gpt-oss fixtures (plugins/gptoss): tiny random GptOssForCausalLM
checkpoints saved by transformers, in both on-disk expert layouts:

- the dequantised layout transformers writes when it saves
  (mlp.experts.gate_up_proj [E, H, 2I] with gate/up interleaved columns,
  down_proj [E, I, H]);
- the Hub release's MXFP4 layout (mlp.experts.*_blocks [E, N, K/32, 16] U8 and
  *_scales [E, N, K/32] U8, N the output rows), made by quantising the random
  experts by the OCP MX rules (one E8M0 scale per 32 values, E2M1 elements
  rounded to nearest even, saturating at ±6). The layout is checked against
  transformers' own dequantiser (convert_moe_packed_tensors) before anything
  is written, and the reference logits are transformers' on the dequantised
  values. Then transformers loads the MXFP4 checkpoint itself (its Mxfp4
  quantizer dequantises on CPU) and must give the same logits; that needs
  accelerate, which requirements-gen.txt does not pin, so without it the
  check is reported as skipped. (Run with accelerate 1.10.1 added: max
  |Δlogits| 0.0.)

A sliding window (4) shorter than the prompts (7 and 4), so the prefill, the
decode steps past it and a chunked prefill all cross it. Called from
generate.py (registered there); the helpers are generate.py's.
"""

import json
import os
import shutil

import numpy as np
import torch
import transformers

YARN = dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
            original_max_position_embeddings=16, truncate=False)

# hidden and intermediate multiples of 32 (MXFP4 blocks); nH*hd (64) = hidden.
GPTOSS = dict(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
              max_position_embeddings=128, rms_norm_eps=1e-5, initializer_range=0.25, rope_parameters=YARN,
              swiglu_limit=7.0, bos_token_id=1, eos_token_id=2)

GPTOSS_SPEC = {
    # Dequantised experts (transformers' own save), bf16, layer_types not
    # alternating.
    "gptoss-bf16-sliding": (dict(layer_types=["full_attention", "sliding_attention", "sliding_attention"]),
                            "bfloat16", {"seed": 3001}),
    # The Hub release's form: MXFP4 experts with quantization_config, the
    # rest bf16, rope in rope_theta + rope_scaling, no layer_types (the
    # default: layer i slides when i is even), 4 layers.
    "gptoss-mxfp4": (dict(num_hidden_layers=4, num_local_experts=6, num_experts_per_tok=3), "bfloat16",
                     {"seed": 3002, "mxfp4": True, "legacy_rope_config": True, "drop_layer_types": True}),
}

FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)


def mx_quantise(w):
    """OCP MX (MXFP4) quantisation of w [..., N, K] along K: blocks
    [..., N, K/32, 16] U8 (low nibble = even column), scales [..., N, K/32]
    U8 (E8M0: 2^(s-127))."""
    w = np.asarray(w, dtype=np.float64)
    *prefix, n, k = w.shape
    g = w.reshape(*prefix, n, k // 32, 32)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    assert (amax > 0).all()
    exp = np.floor(np.log2(amax)) - 2  # E2M1's largest normal 6 = 1.5 * 2^2
    scaled = np.abs(g) / np.exp2(exp)
    dist = np.abs(scaled[..., None] - FP4_VALUES)  # [..., 32, 8]
    best = dist.min(axis=-1, keepdims=True)
    ties = dist == best
    # nearest; on a tie the even code (round half to even); beyond 6 saturates to 6.
    even = ties & (np.arange(8) % 2 == 0)
    code = np.where(even.any(-1), even.argmax(-1), ties.argmax(-1))
    code = np.where(scaled > 6, 7, code)
    code = code | np.where((g < 0) & (code > 0), 8, 0)
    code = code.astype(np.uint8).reshape(*prefix, n, k // 32, 16, 2)
    blocks = code[..., 0] | (code[..., 1] << 4)
    scales = (exp[..., 0] + 127).astype(np.uint8)
    return blocks.astype(np.uint8), scales


def mx_dequantise(blocks, scales):
    lut = np.concatenate([FP4_VALUES, -FP4_VALUES])
    lo, hi = lut[blocks & 0x0F], lut[blocks >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def make_model(overrides, seed):
    torch.manual_seed(seed)
    cfg = transformers.GptOssConfig(**{**GPTOSS, **overrides})
    cfg.architectures = ["GptOssForCausalLM"]
    model = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif n.endswith("bias"):
                p.normal_(0.0, 0.2)
            elif n.endswith("sinks"):
                p.normal_(0.0, 1.0)
    return model


def quantise_experts(model):
    """Replaces each layer's experts by their MXFP4 round trip; returns the
    blocks and scales per checkpoint key, checked against transformers'
    convert_moe_packed_tensors."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    packed = {}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(layer.mlp.experts, name)  # [E, in, out]
                blocks, scales = mx_quantise(p.detach().double().numpy().transpose(0, 2, 1))
                deq = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
                mine = torch.from_numpy(mx_dequantise(blocks, scales).transpose(0, 2, 1).copy()).float()
                assert deq.shape == p.shape and torch.equal(deq, mine), f"layer {i} {name}: layout disagrees with transformers"
                # bf16 holds every MXFP4 value exactly (2-bit mantissas)
                assert torch.equal(deq.to(torch.bfloat16).float(), deq)
                p.copy_(deq)
                key = f"model.layers.{i}.mlp.experts.{name}"
                packed[key + "_blocks"] = torch.from_numpy(np.ascontiguousarray(blocks))
                packed[key + "_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
    return packed


def write_mxfp4(model_dir, packed):
    """Rewrites the saved checkpoint with the experts as MXFP4 blocks and
    scales, and the release's quantization_config."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(model_dir, "model.safetensors")
    state = load_file(path)
    for key in list(state):
        if key.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            del state[key]
    state.update(packed)
    save_file(dict(sorted(state.items())), path, metadata={"format": "pt"})
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def edit_config(model_dir, options, g):
    path = os.path.join(model_dir, "config.json")
    if options.get("legacy_rope_config"):
        g.legacy_rope_config(path)
    if options.get("drop_layer_types"):
        with open(path) as f:
            cfg = json.load(f)
        del cfg["layer_types"]
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)


def generate_fixture(dest, name, overrides, dtype, options, seed, g):
    """One fixture, like generate.generate_fixture; g is the generate module."""
    rng = np.random.default_rng(seed)
    vocab = GPTOSS["vocab_size"]
    prompts = [rng.integers(3, vocab, size=n).tolist() for n in g.PROMPT_LENGTHS]
    decode_tokens = [rng.integers(3, vocab, size=g.DECODE_STEPS).tolist() for _ in g.PROMPT_LENGTHS]

    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    model_dir = os.path.join(dest, "model")
    model = make_model(overrides, seed)
    packed = quantise_experts(model) if options.get("mxfp4") else None
    model.to(getattr(torch, dtype)).save_pretrained(model_dir, safe_serialization=True)
    edit_config(model_dir, options, g)
    # transformers' logits of the checkpoint as saved (dequantised experts)
    logits = g.reference(model_dir, prompts, decode_tokens)
    if packed is not None:
        write_mxfp4(model_dir, packed)
        cross_check_mxfp4_load(model_dir, prompts, decode_tokens, logits, g)
    arrays = dict(logits=logits, prompt_lengths=np.array(g.PROMPT_LENGTHS, dtype=np.int64),
                  prompts=g.pad(prompts), decode_tokens=np.array(decode_tokens, dtype=np.int64))
    meta = dict(name=name, checkpoint_dtype=dtype, ctx_len=g.CTX_LEN, decode_steps=g.DECODE_STEPS,
                config_overrides=overrides, options=options, seed=seed,
                transformers=transformers.__version__, torch=torch.__version__)
    np.savez_compressed(os.path.join(dest, "reference.npz"), **arrays)
    with open(os.path.join(dest, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: {dtype}, {sum(os.path.getsize(os.path.join(model_dir, x)) for x in os.listdir(model_dir))} bytes")


def cross_check_mxfp4_load(model_dir, prompts, decode_tokens, logits, g):
    """transformers loading the MXFP4 checkpoint itself (dequantising on
    CPU) must give the same logits; reported, since that path needs the
    quantizer's optional dependencies."""
    try:
        got = g.reference(model_dir, prompts, decode_tokens)
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"  (transformers could not load the MXFP4 checkpoint itself: {type(e).__name__}: {e})")
        return
    diff = np.abs(got - logits).max()
    print(f"  transformers loading the MXFP4 checkpoint itself: max |Δlogits| {diff:.2e}")
    assert diff <= 1e-5, diff
