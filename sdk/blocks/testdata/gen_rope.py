"""Reference values for sdk/blocks' rope and gpt-oss activation tests.

Writes rope_reference.json next to this file: transformers' (5.24, torch
float32 on CPU) yarn inv_freq bit patterns, attention factors and cos/sin
tables for several configs, longrope (Phi-3) short and long tables and the
per-call switch between them, Qwen3-VL interleaved MRoPE cos/sin for 3-row
position ids, and gpt-oss's clamped SwiGLU (GptOssExperts._apply_gate) in
float32 and float16. The Go tests read the JSON; they never run Python.

Run from the repository root with `make sdk-fixtures`, or directly with the
fixtures environment (conformance/requirements-gen.txt, in .venv/gen):

    .venv/gen/bin/python sdk/blocks/testdata/gen_rope.py
"""

import json
import os
import tempfile

import torch
import transformers
from transformers import AutoConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts, GptOssRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

HERE = os.path.dirname(os.path.abspath(__file__))
POSITIONS = [0, 1, 2, 7, 100, 1000, 4095, 4096, 32767, 131071]


def load_config(d):
    """A config as transformers reads config.json (standardising rope keys)."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(d, f)
        return AutoConfig.from_pretrained(tmp)


def bits(t):
    return t.contiguous().view(torch.int32).flatten().tolist()


def floats(t):
    """float32 values to 9 significant digits, which round-trip float32."""
    return [float("%.9g" % x) for x in t.flatten().tolist()]


LLAMA = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
         "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 32}

YARN_CASES = {
    # openai/gpt-oss-20b config.json (rope keys as shipped).
    "gpt-oss": ({"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "head_dim": 64, "num_hidden_layers": 2, "num_local_experts": 4, "vocab_size": 32,
                 "max_position_embeddings": 131072, "rope_theta": 150000,
                 "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                  "original_max_position_embeddings": 4096, "truncate": False}},
                64, GptOssRotaryEmbedding),
    # Qwen3's recommended yarn (truncate defaults to true), 5.x rope_parameters form.
    "truncate": (dict(LLAMA, head_dim=128, max_position_embeddings=131072,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                       "original_max_position_embeddings": 32768}),
                 128, LlamaRotaryEmbedding),
    # DeepSeek-V3 style: mscale and mscale_all_dim give the attention factor.
    "mscale": (dict(LLAMA, head_dim=64, max_position_embeddings=163840, rope_theta=10000,
                    rope_scaling={"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                  "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096}),
               64, LlamaRotaryEmbedding),
    # No factor: max_position_embeddings / original_max_position_embeddings.
    "implicit factor": (dict(LLAMA, head_dim=64, max_position_embeddings=16384, rope_theta=10000,
                             rope_scaling={"rope_type": "yarn", "factor": None,
                                           "original_max_position_embeddings": 2048}),
                        64, LlamaRotaryEmbedding),
    # Partial rotary, non-default betas, explicit attention_factor.
    "partial": (dict(LLAMA, head_dim=128, max_position_embeddings=65536, partial_rotary_factor=0.5,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 8.0, "beta_fast": 16,
                                      "beta_slow": 2, "attention_factor": 1.25,
                                      "original_max_position_embeddings": 8192}),
                128, LlamaRotaryEmbedding),
}


def yarn_case(name, d, head_dim, cls):
    cfg = load_config(d)
    rope = cls(cfg)
    pos = torch.tensor([POSITIONS])
    x = torch.zeros(1, len(POSITIONS), head_dim)
    cos, sin = rope(x, pos)
    # base ** (2i/dim) exactly as _compute_yarn_parameters computes it: torch's
    # vectorised pow (SLEEF, 1-ulp) is not always correctly rounded, so the Go
    # test checks the yarn blend bit-exact from these, and inv_freq to 1 ulp.
    dim = 2 * rope.inv_freq.numel()
    theta = cfg.rope_parameters["rope_theta"]
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    return {"name": name, "pos_freqs_bits": bits(pos_freqs), "config": {k: v for k, v in d.items() if k not in ("model_type",)}, "head_dim": head_dim,
            "inv_freq_bits": bits(rope.inv_freq), "attention_factor": rope.attention_scaling,
            "positions": POSITIONS, "cos": floats(cos[0]), "sin": floats(sin[0])}


PHI3 = {"model_type": "phi3", "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 32}

LONGROPE_CASES = {
    # Phi-3.5-mini's shape: head_dim 96, no factor (max / original gives the
    # attention factor), original_max_position_embeddings at the top level.
    "phi3.5": dict(PHI3, hidden_size=3072, num_attention_heads=32, num_key_value_heads=32,
                   max_position_embeddings=131072, original_max_position_embeddings=4096,
                   rope_scaling={"type": "longrope", "short_factor": [1 + 0.02 * i for i in range(48)],
                                 "long_factor": [1 + 0.5 * i ** 1.3 for i in range(48)]}, rope_theta=10000.0),
    # Phi-4-mini's shape: partial_rotary_factor 0.75 of head_dim 128,
    # explicit factor and attention_factor, 5.x rope_parameters form.
    "phi4-mini partial": dict(PHI3, hidden_size=3072, num_attention_heads=24, num_key_value_heads=8,
                              max_position_embeddings=131072, original_max_position_embeddings=4096,
                              rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.75, "factor": 32.0, "attention_factor": 1.19,
                                               "short_factor": [1 + 0.01 * i for i in range(48)],
                                               "long_factor": [1.5 + 0.7 * i for i in range(48)]}),
}
SHORT_POSITIONS = [0, 1, 2, 7, 100, 1000, 4095]  # max + 1 = 4096: the short table
LONG_POSITIONS = [0, 1, 2, 7, 100, 1000, 4095, 4096, 32767, 131071]  # beyond: the long table


def longrope_case(name, d):
    cfg = load_config(d)
    rope = Phi3RotaryEmbedding(cfg)
    dim = 2 * rope.inv_freq.numel()
    theta = cfg.rope_parameters["rope_theta"]
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    out = {"name": name, "config": {k: v for k, v in d.items() if k != "model_type"},
           "head_dim": d["hidden_size"] // d["num_attention_heads"], "pos_freqs_bits": bits(pos_freqs),
           "attention_factor": rope.attention_scaling}
    # One call each, short then long then short again: transformers switches
    # the table per forward from max(position_ids) + 1.
    for label, positions in (("short", SHORT_POSITIONS), ("long", LONG_POSITIONS)):
        x = torch.zeros(1, len(positions), dim)
        cos, sin = rope(x, torch.tensor([positions]))
        out[label] = {"positions": positions, "inv_freq_bits": bits(rope.inv_freq), "cos": floats(cos[0]),
                      "sin": floats(sin[0])}
    rope(torch.zeros(1, len(SHORT_POSITIONS), dim), torch.tensor([SHORT_POSITIONS]))
    assert bits(rope.inv_freq) == out["short"]["inv_freq_bits"], "the short table is not restored"
    return out


def mrope():
    text = {"head_dim": 128, "hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 262144, "rope_theta": 5000000,
            "rope_scaling": {"rope_type": "default", "mrope_interleaved": True, "mrope_section": [24, 20, 20]}}
    cfg = load_config({"model_type": "qwen3_vl", "text_config": dict(text, model_type="qwen3_vl_text")}).text_config
    rope = Qwen3VLTextRotaryEmbedding(cfg)
    # Text, then a 2x3 image grid at offset 3, then text again (rows T, H, W).
    t = [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 100000]
    h = [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 100000]
    w = [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 100000]
    pos = torch.tensor([[t], [h], [w]])  # [3, B=1, S]
    x = torch.zeros(1, len(t), 128)
    cos, sin = rope(x, pos)
    return {"config": text, "head_dim": 128, "inv_freq_bits": bits(rope.inv_freq), "position_ids": [[t], [h], [w]],
            "cos": floats(cos[0]),
            "sin": floats(sin[0])}


def swiglu():
    cfg = load_config({"model_type": "gpt_oss", "hidden_size": 8, "intermediate_size": 6, "num_local_experts": 2,
                       "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "num_hidden_layers": 1,
                       "vocab_size": 8, "swiglu_limit": 7.0})
    experts = GptOssExperts(cfg)
    g = torch.Generator().manual_seed(0)
    gate = (torch.randn(4, 6, generator=g) * 6).float()
    up = (torch.randn(4, 6, generator=g) * 6).float()
    gate[0, :3] = torch.tensor([7.0, 7.5, -30.0])
    up[0, :3] = torch.tensor([-7.5, 8.0, 7.0])
    gate_up = torch.stack([gate, up], dim=-1).reshape(4, 12)  # gate at even, up at odd columns
    out = {"alpha": experts.alpha, "limit": experts.limit, "gate": floats(gate), "up": floats(up), "shape": [4, 6]}
    for name, dt in (("float32", torch.float32), ("float16", torch.float16)):
        gu = gate_up.to(dt)
        out["gate_" + name] = floats(gu[..., ::2].float())
        out["up_" + name] = floats(gu[..., 1::2].float())
        out["out_" + name] = floats(experts._apply_gate(gu).float())
    return out


def main():
    torch.set_default_dtype(torch.float32)
    ref = {"transformers": transformers.__version__, "torch": torch.__version__,
           "yarn": [yarn_case(n, *c) for n, c in YARN_CASES.items()],
           "longrope": [longrope_case(n, d) for n, d in LONGROPE_CASES.items()], "mrope": mrope(), "swiglu": swiglu()}
    with open(os.path.join(HERE, "rope_reference.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
