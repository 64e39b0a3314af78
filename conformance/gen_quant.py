"""Quantised-checkpoint fixtures, registered in generate.py (QUANT_SPEC).

Each fixture is a tiny random model of generate.py (random norms and
biases), quantised and saved the way the format's own tool writes it, with
reference logits from transformers loading the quantised directory and
dequantising on CPU in float32 (generate.reference, unchanged):

- "fp8" (transformers FineGrainedFP8, block scales): transformers only
  quantises on a GPU, and its Fp8Quantize leaves weights whose shape the block
  does not divide unquantised; so the weights are quantised here by
  Fp8Quantize's formula (per block amax, scale 448/amax, clamp, cast to
  float8_e4m3fn, weight_scale_inv = 1/scale in float32) on a ceil-divided
  block grid (the last block of a dimension partial). transformers loads it
  (on CPU it dequantises: Fp8Dequantize).
- "ct" (compressed-tensors): apply_quantization_config, the weights'
  min/max turned into scales and zero points by compressed-tensors'
  calculate_qparams (what llm-compressor's min-max observer does), then
  ModelCompressor compress_model + save_pretrained + update_config, as
  llm-compressor saves. Qwen3-MoE experts are fused in transformers 5, so
  the MoE checkpoint is quantised on its per-expert keys: a stand-in module
  tree of nn.Linear named like the checkpoint.
- "modelopt" (NVIDIA ModelOpt HF export, NVFP4 / FP8): ModelOpt does not run
  here and transformers has no loader for it, so the weights are quantised by
  ModelOpt's formulas, input_scale calibrated on random tokens, and the
  reference is transformers on the float32 model whose Linear weights are
  the dequantised values (weight-only: the activation quantisation these
  formats apply in vLLM / TensorRT-LLM is not in the reference).

Every fixture is also checked against an independent dequantisation of the
files written (dequantise()): a dense float32 checkpoint of those weights
must give transformers' logits (max |Δ| printed), and the logits must differ
from the unquantised model's by a plausible quantisation error.
QUANT_NOTES.md records the formats and what these checks found.
"""

import json
import math
import os
import shutil
import tempfile

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])

MOE_ROUTER_IGNORE = "re:.*mlp.gate$"  # llm-compressor recipes' router ignore
MOE_PREFIXES = ("qwen3moe", "deepseek")  # fixtures whose experts transformers 5 holds fused

QUANT_SPEC = {
    # name: (config overrides, dtype, options); explicit seeds.
    "llama-fp8-block": (dict(num_key_value_heads=2), "bfloat16",
                        {"seed": 4001, "quant": {"kind": "fp8", "block": [128, 128]}}),
    "llama-fp8-block32": (dict(num_key_value_heads=2, intermediate_size=80), "float32",
                          {"seed": 4002, "quant": {"kind": "fp8", "block": [32, 32]}}),
    "qwen3moe-fp8-block": (dict(), "bfloat16", {"seed": 4003, "quant": {"kind": "fp8", "block": [32, 32]}}),
    "llama-ct-fp8-channel": (dict(num_key_value_heads=2), "bfloat16",
                             {"seed": 4004, "quant": {"kind": "ct", "type": "float", "bits": 8, "strategy": "channel"}}),
    "llama-ct-fp8-tensor": (dict(num_key_value_heads=2), "float32",
                            {"seed": 4005, "quant": {"kind": "ct", "type": "float", "bits": 8, "strategy": "tensor"}}),
    "llama-ct-fp8-block": (dict(num_key_value_heads=2, intermediate_size=80), "bfloat16",
                           {"seed": 4006, "quant": {"kind": "ct", "type": "float", "bits": 8, "strategy": "block",
                                                    "block_structure": [32, 32]}}),
    "llama-ct-w4a16-group": (dict(num_key_value_heads=2), "bfloat16",
                             {"seed": 4007, "quant": {"kind": "ct", "type": "int", "bits": 4, "strategy": "group",
                                                      "group_size": 32}}),
    "llama-ct-w4a16-asym": (dict(num_key_value_heads=2), "bfloat16",
                            {"seed": 4008, "quant": {"kind": "ct", "type": "int", "bits": 4, "strategy": "group",
                                                     "group_size": 32, "symmetric": False}}),
    "llama-ct-w8a16-channel": (dict(num_key_value_heads=2), "float32",
                               {"seed": 4009, "quant": {"kind": "ct", "type": "int", "bits": 8, "strategy": "channel"}}),
    "qwen3moe-ct-w4a16": (dict(), "bfloat16",
                          {"seed": 4010, "quant": {"kind": "ct", "type": "int", "bits": 4, "strategy": "group",
                                                   "group_size": 32}}),
    # FP8_DYNAMIC as llm-compressor's preset: per-channel weights and
    # per-token dynamic FP8 input activations, which transformers applies.
    "llama-ct-fp8-dynamic": (dict(num_key_value_heads=2), "bfloat16",
                             {"seed": 4013, "quant": {"kind": "ct", "type": "float", "bits": 8, "strategy": "channel",
                                                      "activations": "fp8_token"}}),
    "llama-modelopt-nvfp4": (dict(num_key_value_heads=2), "bfloat16",
                             {"seed": 4011, "quant": {"kind": "modelopt", "algo": "NVFP4"}}),
    "llama-modelopt-fp8": (dict(num_key_value_heads=2), "bfloat16",
                           {"seed": 4012, "quant": {"kind": "modelopt", "algo": "FP8"}}),
    # DeepSeek-V3's release layout: every linear but the router and the head
    # in FP8 blocks, kv_a_proj_with_mqa's rows not a multiple of the block
    # (576 of 128 in the release; 24 of 16 here).
    "deepseek-fp8-block": (dict(num_hidden_layers=2, n_group=2, topk_group=1, routed_scaling_factor=2.5), "bfloat16",
                           {"seed": 4021, "quant": {"kind": "fp8", "block": [16, 16]}}),
    # Kimi-K2-Thinking's layout: routed experts alone in INT4 (pack-quantized,
    # symmetric; group 32 there, 16 here for moe_intermediate_size 16), attention,
    # dense MLP and shared experts not.
    "deepseek-ct-w4a16-experts": (dict(num_hidden_layers=2, n_group=2, topk_group=1, routed_scaling_factor=2.5), "bfloat16",
                                  {"seed": 4022, "quant": {"kind": "ct", "type": "int", "bits": 4, "strategy": "group",
                                                           "group_size": 16, "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*",
                                                                                        "re:.*layers\\.0\\.mlp\\..*"]}}),
}

CT_VERSION = None  # filled on first use
MODELOPT_VERSION = "0.29.0"  # the producer version written (ModelOpt itself is not run)


# ----------------------------------------------------------------------------
# Checkpoint helpers


def read_state(model_dir):
    return load_file(os.path.join(model_dir, "model.safetensors"))


def write_state(model_dir, state):
    save_file(dict(sorted(state.items())), os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})


def edit_config(model_dir, fn):
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    fn(cfg)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def linear_weights(state, skip):
    """The checkpoint keys of nn.Linear weights (2-D, not the embedding),
    minus the modules skip(module_name) says are not quantised."""
    out = []
    for k, v in state.items():
        if not k.endswith(".weight") or v.ndim != 2 or "embed_tokens" in k:
            continue
        if skip(k[: -len(".weight")]):
            continue
        out.append(k)
    return sorted(out)


def is_router(module):
    return module.endswith("mlp.gate")


# ----------------------------------------------------------------------------
# FineGrainedFP8 (transformers): Fp8Quantize's formula on a ceil block grid


def fp8_block_quantise(w, block):
    """w [rows, cols] -> (float8_e4m3fn [rows, cols], float32 [ceil(rows/bm), ceil(cols/bn)])."""
    bm, bn = block
    rows, cols = w.shape
    R, C = math.ceil(rows / bm), math.ceil(cols / bn)
    x = torch.nn.functional.pad(w.to(torch.float32), (0, C * bn - cols, 0, R * bm - rows))  # zeros: amax unchanged
    blocks = x.reshape(R, bm, C, bn)
    amax = blocks.abs().amax(dim=(-3, -1))
    scale = FP8_MAX / torch.where(amax > 0, amax, torch.ones_like(amax))
    scale = torch.where(amax > 0, scale, torch.ones_like(scale))
    inv = (1.0 / scale).to(torch.float32)
    q = torch.clamp(blocks * scale[:, None, :, None], min=-FP8_MAX, max=FP8_MAX).to(FP8)
    return q.reshape(R * bm, C * bn)[:rows, :cols].contiguous(), inv


def quantise_fp8_block(model_dir, name, block):
    moe = name.startswith(MOE_PREFIXES)
    skip_cfg = ["lm_head", "mlp.gate"] if moe else ["lm_head"]
    state = read_state(model_dir)
    for k in linear_weights(state, lambda m: m == "lm_head" or is_router(m)):
        q, inv = fp8_block_quantise(state[k], block)
        state[k] = q
        state[k[: -len("weight")] + "weight_scale_inv"] = inv
    write_state(model_dir, state)
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": list(block),
          "modules_to_not_convert": skip_cfg}
    edit_config(model_dir, lambda cfg: cfg.__setitem__("quantization_config", qc))
    return qc, {"format": "fp8 (FineGrainedFP8, block)", "tool": "own",
                "notes": "Fp8Quantize's formula (transformers 5.24 integrations/finegrained_fp8.py) on a ceil-divided "
                         "block grid; transformers quantises only on GPU and its Fp8Quantize skips shapes the block "
                         "does not divide. Reference: transformers loading this checkpoint (CPU: Fp8Dequantize)."}


# ----------------------------------------------------------------------------
# compressed-tensors


def ct_args(q):
    from compressed_tensors.quantization import QuantizationArgs

    kw = dict(num_bits=q["bits"], type=q["type"], strategy=q["strategy"], symmetric=q.get("symmetric", True),
              dynamic=False)
    if "group_size" in q:
        kw["group_size"] = q["group_size"]
    if "block_structure" in q:
        kw["block_structure"] = q["block_structure"]
    return QuantizationArgs(**kw)


def observe(w, args):
    """Weight min/max in the scale's shape, as llm-compressor's min-max
    observer takes them (over the whole tensor, a row, a group or a block)."""
    from compressed_tensors.quantization.utils import maybe_pad_tensor_for_block_quant

    s = str(getattr(args.strategy, "value", args.strategy))
    if s == "tensor":
        return w.amin().reshape(1), w.amax().reshape(1)
    if s == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    if s == "group":
        g = w.unflatten(-1, (w.shape[-1] // args.group_size, args.group_size))
        return g.amin(-1), g.amax(-1)
    if s == "block":
        bm, bn = args.block_structure
        x = maybe_pad_tensor_for_block_quant(w, (bm, bn))  # zero padding: calculate_qparams takes 0 into the range
        b = x.reshape(x.shape[0] // bm, bm, x.shape[1] // bn, bn)
        return b.amin(dim=(1, 3)), b.amax(dim=(1, 3))
    raise ValueError(s)


def ct_calibrate(model):
    from compressed_tensors.quantization.utils import calculate_qparams

    with torch.no_grad():
        for _, m in model.named_modules():
            scheme = getattr(m, "quantization_scheme", None)
            if scheme is None or scheme.weights is None:
                continue
            lo, hi = observe(m.weight.data, scheme.weights)
            scale, zp = calculate_qparams(lo, hi, scheme.weights)
            m.weight_scale.data.copy_(scale.reshape(m.weight_scale.shape))
            if hasattr(m, "weight_zero_point"):
                m.weight_zero_point.data.copy_(zp.reshape(m.weight_zero_point.shape))


def ct_config(q, ignore):
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme

    from compressed_tensors.quantization import QuantizationArgs

    fmt = "float-quantized" if q["type"] == "float" else None
    inputs = None
    if q.get("activations") == "fp8_token":
        inputs = QuantizationArgs(num_bits=8, type="float", strategy="token", dynamic=True, symmetric=True)
    scheme = QuantizationScheme(targets=["Linear"], weights=ct_args(q), input_activations=inputs, format=fmt)
    return QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore)


def shadow_linears(state, keys):
    """A module tree of nn.Linear named like the checkpoint keys (the
    per-expert layout), for compressed-tensors to quantise."""
    root = torch.nn.Module()
    for k in keys:
        *path, leaf = k[: -len(".weight")].split(".")
        parent = root
        for p in path:
            if not hasattr(parent, p):
                parent.add_module(p, torch.nn.Module())
            parent = getattr(parent, p)
        w = state[k]
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
        lin.weight.data.copy_(w)
        parent.add_module(leaf, lin)
    return root


def quantise_ct(model, model_dir, name, dtype, q):
    import compressed_tensors
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config

    moe = name.startswith(MOE_PREFIXES)
    ignore = ["lm_head", MOE_ROUTER_IGNORE] if moe else ["lm_head"]
    ignore += q.get("ignore", [])
    fmt = "float-quantized" if q["type"] == "float" else None
    model = model.to(getattr(torch, dtype))
    if not moe:
        apply_quantization_config(model, ct_config(q, ignore))
        ct_calibrate(model)
        compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
        compressor.compress_model(model)
        model.save_pretrained(model_dir, safe_serialization=True)
        compressor.update_config(model_dir)
        how = "apply_quantization_config on the model, calculate_qparams of the weights' min/max, " \
              "ModelCompressor.from_pretrained_model + compress_model, save_pretrained, update_config"
    else:
        model.save_pretrained(model_dir, safe_serialization=True)
        state = read_state(model_dir)
        keys = linear_weights(state, lambda m: False)
        shadow = shadow_linears(state, keys)
        apply_quantization_config(shadow, ct_config(q, ignore))
        ct_calibrate(shadow)
        compressor = ModelCompressor.from_pretrained_model(shadow, quantization_format=fmt)
        compressor.compress_model(shadow)
        for k in keys:
            del state[k]
        state.update({k: v.detach().contiguous() for k, v in shadow.state_dict().items()})
        write_state(model_dir, state)
        # llm-compressor writes the ignore list expanded to module names; the
        # recipe's own entries (with the "re:" router pattern) are kept here,
        # which compressed-tensors matches the same way.
        compressor.quantization_config.ignore = ignore
        compressor.update_config(model_dir)
        how = "per-expert checkpoint keys as an nn.Linear tree; apply_quantization_config, calculate_qparams " \
              "of the weights' min/max, ModelCompressor compress_model, update_config; ignore kept as the " \
              "recipe's (llm-compressor would expand it to module names)"
    with open(os.path.join(model_dir, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    return qc, {"format": f"compressed-tensors {qc['format']}", "tool": f"compressed-tensors {compressed_tensors.__version__}",
                "notes": how + ". Reference, unless fixture.json's \"reference\" says otherwise: transformers "
                               "loading this checkpoint (default CompressedTensorsConfig, dequantize=False: "
                               "decompressed on the first forward, in float32)."}


# ----------------------------------------------------------------------------
# ModelOpt (NVFP4, FP8 per-tensor)


def e2m1_codes(x):
    """Round to nearest E2M1 (ties to the even code), saturating at 6; codes
    with the sign in bit 3."""
    mags = E2M1[:8]
    a = x.abs().clamp(max=6.0)
    d = (a[..., None] - mags).abs()
    best = d.min(-1, keepdim=True).values
    ties = d == best
    even = ties & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(-1), even.to(torch.int8).argmax(-1), ties.to(torch.int8).argmax(-1))
    return (code | torch.where(x < 0, 8, 0)).to(torch.uint8)


def nvfp4_quantise(w, group=16):
    """ModelOpt's NVFP4 weight quantisation: weight_scale_2 = amax/(6*448)
    (F32), weight_scale = fp8(block_amax/6 / weight_scale_2), codes of
    w / (float(weight_scale) * weight_scale_2); two codes a byte, element 2i
    in the low nibble."""
    w = w.to(torch.float32)
    n, k = w.shape
    s2 = w.abs().amax() / (6.0 * FP8_MAX)
    blocks = w.reshape(n, k // group, group)
    s1 = blocks.abs().amax(-1) / 6.0 / s2
    s1 = torch.where(s1 == 0, torch.ones_like(s1), s1).to(FP8)
    scaled = blocks / (s1.to(torch.float32) * s2)[..., None]
    codes = e2m1_codes(scaled.reshape(n, k))
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), s1.contiguous(), s2.to(torch.float32)


def activation_amax(model, ids):
    """max |input| of every nn.Linear over a forward pass (ModelOpt's max
    calibration of input_scale)."""
    amax, hooks = {}, []
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            def hook(mod, args, n=n):
                amax[n] = max(amax.get(n, 0.0), args[0].detach().abs().max().item())
            hooks.append(m.register_forward_pre_hook(hook))
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    return amax


def quantise_modelopt(model, model_dir, dtype, algo, seed):
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(model_dir, safe_serialization=True)
    calib = torch.from_numpy(np.random.default_rng(seed + 500).integers(3, model.config.vocab_size, size=(4, 16)))
    amax = activation_amax(model.float(), calib)
    state = read_state(model_dir)
    for k in linear_weights(state, lambda m: m == "lm_head"):
        module = k[: -len(".weight")]
        w = state[k]
        if algo == "NVFP4":
            packed, s1, s2 = nvfp4_quantise(w)
            state[k] = packed
            state[module + ".weight_scale"] = s1
            state[module + ".weight_scale_2"] = s2
            state[module + ".input_scale"] = torch.tensor(amax[module] / (6.0 * FP8_MAX), dtype=torch.float32)
        else:
            s = (w.to(torch.float32).abs().amax() / FP8_MAX).to(torch.float32)
            state[k] = torch.clamp(w.to(torch.float32) / s, -FP8_MAX, FP8_MAX).to(FP8)
            state[module + ".weight_scale"] = s
            state[module + ".input_scale"] = torch.tensor(amax[module] / FP8_MAX, dtype=torch.float32)
    write_state(model_dir, state)
    quant = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
    if algo == "NVFP4":
        quant["group_size"] = 16
    hf_quant = {"producer": {"name": "modelopt", "version": MODELOPT_VERSION}, "quantization": quant}
    with open(os.path.join(model_dir, "hf_quant_config.json"), "w") as f:
        json.dump(hf_quant, f, indent=4)
    # config.json's quantization_config: ModelOpt's convert_hf_quant_config_format
    # (modelopt/torch/export/convert_hf_config.py) of the above.
    bits, extra = (4, {"group_size": 16}) if algo == "NVFP4" else (8, {})
    args = {"dynamic": False, "num_bits": bits, "type": "float", **extra}
    qc = {"config_groups": {"group_0": {"input_activations": dict(args), "weights": dict(args), "targets": ["Linear"]}},
          "ignore": ["lm_head"], "quant_algo": algo, "producer": hf_quant["producer"], "quant_method": "modelopt"}
    edit_config(model_dir, lambda cfg: cfg.__setitem__("quantization_config", qc))
    return qc, hf_quant, {
        "format": f"modelopt {algo}", "tool": "own",
        "notes": "ModelOpt's formulas (NVFP4: weight_scale_2 = amax/(6*448), weight_scale = fp8(block amax/6/weight_scale_2), "
                 "E2M1 round-to-nearest-even, low nibble = even element; FP8: weight_scale = amax/448); input_scale "
                 "from max |input| over random tokens (/(6*448) NVFP4, /448 FP8), not used by the reference. "
                 "transformers 5.24 has no modelopt loader."}


# ----------------------------------------------------------------------------
# Independent dequantisation of the files written (the semantics QUANT_NOTES.md states)


def unpack_int32(packed, bits, cols):
    """compressed-tensors pack-quantized: element i of a row at bit i*bits of
    the row's little-endian int32 stream, stored unsigned (+2^(bits-1))."""
    u = packed.numpy().astype("<u4")  # rows, words
    stream = np.unpackbits(u.view(np.uint8), axis=-1, bitorder="little")  # rows, words*32 bits, LSB first
    n = (stream.shape[-1] // bits)
    vals = stream[:, : n * bits].reshape(stream.shape[0], n, bits)
    vals = (vals.astype(np.int64) << np.arange(bits)).sum(-1)
    return torch.from_numpy(vals[:, :cols] - (1 << (bits - 1)))


def dequantise(model_dir, round_to=None, only=lambda k: True):
    """The checkpoint's linear weights dequantised to float32 by the formulas
    of QUANT_NOTES.md; round_to (a dtype) rounds each result to it (to test
    where the loader rounds)."""
    state = read_state(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    out = {}
    method = qc["quant_method"]
    for k, v in state.items():
        module, _, param = k.rpartition(".")
        if method == "fp8" and param == "weight_scale_inv":
            continue
        if method == "compressed-tensors" and param in ("weight_scale", "weight_zero_point", "weight_shape"):
            continue
        if method == "modelopt" and param in ("weight_scale", "weight_scale_2", "input_scale"):
            continue
        w = None
        if method == "fp8" and module + ".weight_scale_inv" in state and param == "weight":
            s = state[module + ".weight_scale_inv"].to(torch.float32)  # [ceil(rows/bm), ceil(cols/bn)]
            bm, bn = qc["weight_block_size"]
            full = s.repeat_interleave(bm, 0)[: v.shape[0]].repeat_interleave(bn, 1)[:, : v.shape[1]]
            w = v.to(torch.float32) * full
        elif method == "compressed-tensors" and param in ("weight", "weight_packed") and module + ".weight_scale" in state:
            args = qc["config_groups"]["group_0"]["weights"]
            s = state[module + ".weight_scale"].to(torch.float32)
            if param == "weight_packed":
                rows, cols = state[module + ".weight_shape"].tolist()
                q = unpack_int32(v, args["num_bits"], cols).to(torch.float32)
            else:
                q = v.to(torch.float32)
                rows, cols = q.shape
            zp = state.get(module + ".weight_zero_point")
            if zp is not None:
                if param == "weight_packed":  # packed along the output rows
                    zp = unpack_int32(zp.t().contiguous(), args["num_bits"], rows).t()
                zp = zp.to(torch.float32)
            st = args["strategy"]
            if st in ("tensor", "channel"):
                full_s = s.expand(rows, cols)  # [1] or [rows, 1]
                full_z = None if zp is None else zp.expand(rows, cols)
            elif st == "group":
                g = args["group_size"]
                full_s = s.repeat_interleave(g, 1)
                full_z = None if zp is None else zp.repeat_interleave(g, 1)
            elif st == "block":
                bm, bn = args["block_structure"]
                full_s = s.repeat_interleave(bm, 0)[:rows].repeat_interleave(bn, 1)[:, :cols]
                full_z = None
            w = ((q - full_z) if full_z is not None else q) * full_s
            k = module + ".weight"
        elif method == "modelopt" and param == "weight" and module + ".weight_scale" in state:
            if v.dtype == torch.uint8:
                codes = torch.stack([v & 0x0F, v >> 4], dim=-1).reshape(v.shape[0], -1).long()
                vals = E2M1[codes]
                s = state[module + ".weight_scale"].to(torch.float32) * state[module + ".weight_scale_2"]
                w = (vals.reshape(v.shape[0], -1, 16) * s[..., None]).reshape(vals.shape)
            else:
                w = v.to(torch.float32) * state[module + ".weight_scale"]
        if w is None:
            out[k] = v.to(torch.float32)
        else:
            out[k] = w.to(round_to).to(torch.float32) if round_to is not None and only(k) else w
    return out


@torch.no_grad()
def reference_with(model_dir, prompts, decode_tokens, g, ct_dequantize=False):
    """generate.reference with CompressedTensorsConfig(dequantize=True) passed
    to from_pretrained (the same loop otherwise)."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    kw = {"quantization_config": CompressedTensorsConfig(dequantize=True)} if ct_dequantize else {}
    import gen_qwen3vl  # its reference() runs the loop on a loaded model

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager", **kw).eval()
    return gen_qwen3vl.reference(model, prompts, decode_tokens)


def fp8_dequantise_transformers(model_dir, block):
    """The weights dequantised by transformers' own _dequantize_fp8_weight
    (finegrained_fp8.py; the helper FP8Linear's backward uses), which takes
    a ceil-divided scale grid."""
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    state = read_state(model_dir)
    out = {}
    for k, v in state.items():
        if k.endswith(".weight_scale_inv"):
            continue
        inv = state.get(k[: -len("weight")] + "weight_scale_inv") if k.endswith(".weight") else None
        out[k] = v.to(torch.float32) if inv is None else _dequantize_fp8_weight(v, inv, list(block), torch.float32)
    return out


def dense_dir(model_dir, tensors, dest):
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    with open(os.path.join(dest, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(model_dir, extra)):
            shutil.copy(os.path.join(model_dir, extra), dest)
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(dest, "model.safetensors"),
              metadata={"format": "pt"})


def dtypes_on_disk(model_dir):
    seen = {}
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        for k in f.keys():
            param = k.rpartition(".")[2]
            t = f.get_slice(k)
            seen.setdefault(param, set()).add(t.get_dtype())
    return {k: sorted(v) for k, v in sorted(seen.items())}


# ----------------------------------------------------------------------------


def generate_fixture(dest, name, overrides, dtype, options, g):
    seed = options["seed"]
    q = options["quant"]
    rng = np.random.default_rng(seed)
    vocab = g.BASE["vocab_size"]
    prompts = [rng.integers(3, vocab, size=n).tolist() for n in g.PROMPT_LENGTHS]
    decode_tokens = [rng.integers(3, vocab, size=g.DECODE_STEPS).tolist() for _ in g.PROMPT_LENGTHS]

    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    model_dir = os.path.join(dest, "model")
    model = g.make_model(name, overrides, seed)
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, "plain")
        model.to(getattr(torch, dtype)).save_pretrained(plain, safe_serialization=True)
        unquantised = g.reference(plain, prompts, decode_tokens)
        original = {k: v.to(torch.float32) for k, v in read_state(plain).items()}

    meta_extra, alternates = {}, {}
    if q["kind"] == "fp8":
        model.to(getattr(torch, dtype)).save_pretrained(model_dir, safe_serialization=True)
        qc, quant = quantise_fp8_block(model_dir, name, q["block"])
        try:
            logits = g.reference(model_dir, prompts, decode_tokens)
        except RuntimeError as e:
            # transformers' CPU loader (Fp8Dequantize._dequantize_one) needs the
            # scale grid to divide the weight: partial blocks fail to load.
            print(f"  transformers cannot load {name} on CPU: {str(e).splitlines()[0]}")
            with tempfile.TemporaryDirectory() as tmp:
                d = os.path.join(tmp, "dense")
                dense_dir(model_dir, fp8_dequantise_transformers(model_dir, q["block"]), d)
                logits = g.reference(d, prompts, decode_tokens)
            meta_extra["reference"] = (
                "weight-only dequantised by transformers' _dequantize_fp8_weight (ceil block grid); transformers "
                "5.24 cannot load this checkpoint on CPU: Fp8Dequantize raises 'Weight shape (80, 64) not divisible "
                "by scale grid (3, 2)'")
    elif q["kind"] == "ct":
        qc, quant = quantise_ct(model, model_dir, name, dtype, q)
        alternates["transformers_dequantize_true"] = reference_with(model_dir, prompts, decode_tokens, g,
                                                                    ct_dequantize=True)
        try:
            logits = g.reference(model_dir, prompts, decode_tokens)
        except RuntimeError as e:
            # transformers 5.24 + compressed-tensors 0.20.1's default path
            # (dequantize=False) builds weight_zero_point on the meta device
            # unpacked, [out, groups], and the checkpoint's packed [out/8,
            # groups] fails to load; dequantize=True loads it.
            print(f"  default load failed ({str(e).splitlines()[0][:90]})")
            logits = None
            meta_extra["reference"] = (
                "weight-only dequantised by formula, float32 (no transformers loader): transformers' default load "
                "(dequantize=False) fails on the packed weight_zero_point (size mismatch [out/8, groups] vs "
                "[out, groups]); CompressedTensorsConfig(dequantize=True) loads it but rounds each dequantised "
                "weight to the scale's dtype (bf16)")
        if logits is not None and name.startswith(MOE_PREFIXES):
            # Both transformers paths keep the decompressed experts in the
            # scale's dtype (bf16) and run them in bf16 (grouped_mm casts the
            # input to the weight's dtype), whatever dtype= says.
            alternates["transformers_default"] = logits
            logits = None
            meta_extra["reference"] = (
                "weight-only dequantised by formula, float32 (no transformers loader): transformers 5.24 keeps the "
                "decompressed experts in the scale's dtype (bf16) and computes them in bf16 even with dtype=float32 "
                "(attention weights: float32)")
    else:
        qc, hf_quant, quant = quantise_modelopt(model, model_dir, dtype, q["algo"], seed)
        logits = None
        meta_extra["reference"] = "weight-only dequantised by formula (no transformers loader)"

    # Independent dequantisation (the formulas of QUANT_NOTES.md), float32 and
    # with each dequantised weight rounded to bf16, against every transformers
    # path run: one of them must agree exactly.
    formula = {}
    with tempfile.TemporaryDirectory() as tmp:
        variants = [("f32", None, lambda k: True), ("bf16-rounded", torch.bfloat16, lambda k: True)]
        if name.startswith(MOE_PREFIXES):
            variants.append(("experts-bf16-rounded", torch.bfloat16, lambda k: ".experts." in k))
        for label, round_to, only in variants:
            d = os.path.join(tmp, label)
            dense_dir(model_dir, dequantise(model_dir, round_to, only), d)
            formula[label] = g.reference(d, prompts, decode_tokens)
    if logits is not None:
        alternates = {"reference": logits, **alternates}
    else:
        logits = formula["f32"]
    assert np.isfinite(logits).all(), name
    checks = {src: {label: float(np.abs(other - mine).max()) for label, mine in formula.items()}
              for src, other in alternates.items()}
    quant["formula_vs_transformers"] = checks
    deq = dequantise(model_dir)
    changed = [k for k in deq if not torch.equal(deq[k], original[k])]
    err = {k: float((deq[k] - original[k]).norm() / original[k].norm()) for k in changed}
    werr = float(np.sqrt(np.mean(np.square(list(err.values())))))
    print(f"  {len(changed)} weights quantised, relative weight error rms {werr:.4f} (max {max(err.values()):.4f})")
    delta = float(np.abs(logits - unquantised).max())
    scale = float(np.abs(unquantised).max())
    on_disk = dtypes_on_disk(model_dir)
    print(f"{name}: max |Δlogits| vs unquantised {delta:.4g} (logit scale {scale:.4g}); max |Δ| formula vs transformers: "
          + json.dumps(checks))
    print(f"  on disk: {on_disk}")
    a, b = logits.reshape(-1, logits.shape[-1]), unquantised.reshape(-1, unquantised.shape[-1])
    cos = float(((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)).min())
    print(f"  min cosine(quantised, unquantised logits) over positions {cos:.4f}")
    # a quantisation error: nonzero, weights within the format's error, logits still the model's
    # (a random 2-layer model is chaotic and MoE routing flips: cosines are low for int4)
    assert 0 < delta < scale and cos > 0.4 and 0 < werr < 0.15, (delta, scale, cos, werr)

    quant["delta_vs_unquantised"] = round(delta, 6)
    quant["logit_scale"] = round(scale, 6)
    quant["min_cosine_vs_unquantised"] = round(cos, 6)
    quant["weight_relative_error_rms"] = round(werr, 6)
    arrays = dict(logits=logits, prompt_lengths=np.array(g.PROMPT_LENGTHS, dtype=np.int64),
                  prompts=g.pad(prompts), decode_tokens=np.array(decode_tokens, dtype=np.int64))
    meta = dict(name=name, checkpoint_dtype=dtype, ctx_len=g.CTX_LEN, decode_steps=g.DECODE_STEPS,
                config_overrides=overrides, options=options, seed=seed, quantization=quant,
                transformers=transformers.__version__, torch=torch.__version__, **meta_extra)
    np.savez_compressed(os.path.join(dest, "reference.npz"), **arrays)
    with open(os.path.join(dest, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(model_dir, x)) for x in os.listdir(model_dir))
    print(f"{name}: {dtype}, {size} bytes")
    return dict(name=name, delta=delta, scale=scale, checks=checks, on_disk=on_disk, qc=qc)


def generate(names, g):
    for name in sorted(QUANT_SPEC):
        if name in names:
            overrides, dtype, options = QUANT_SPEC[name]
            generate_fixture(os.path.join(g.FIXTURES, name), name, overrides, dtype, options, g)
