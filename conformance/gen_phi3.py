"""Phi-3 fixtures (plugins/phi3), registered in generate.py.

Tiny random Phi3ForCausalLM checkpoints saved by transformers, with q/k/v
stored fused as self_attn.qkv_proj and gate/up as mlp.gate_up_proj:

- phi3-f32-longrope: longrope with partial_rotary_factor 0.75 (Phi-4-mini's),
  GQA 2, no explicit factor (max_position_embeddings /
  original_max_position_embeddings gives the attention factor, as Phi-3's
  configs have it). transformers picks long_factor or short_factor per
  forward call from max(position_ids) + 1 over the whole batch, while the
  reference runs each sequence alone and the ONNX side batches them; with
  original_max_position_embeddings 3 every call of both uses long_factor
  (sequences of 4 and more), so the two agree and the long factors and the
  attention factor show in the logits. The short table and the switch are
  tested against transformers in sdk/blocks (rope_reference_test.go).
- phi3-bf16-default: default rope, tied embeddings, 8 heads over 2 KV heads,
  sliding_window 6 (the decode positions reach 10).

Every norm weight is randomised, so a norm in the wrong place or missing
shows in the logits.
"""

import torch

LONGROPE = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                short_factor=[1.0, 1.05, 1.2, 1.5, 2.0, 2.5],
                long_factor=[1.0, 1.5, 3.0, 6.0, 12.0, 24.0])

PHI3_SPEC = {
    # name: (config overrides on generate.BASE, dtype, options); explicit seeds.
    "phi3-f32-longrope": (dict(num_key_value_heads=2, original_max_position_embeddings=3, rope_parameters=LONGROPE,
                               pad_token_id=0), "float32", {"seed": 7001}),
    "phi3-bf16-default": (dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True, sliding_window=6,
                               rope_parameters=dict(rope_type="default", rope_theta=10000.0), pad_token_id=0),
                          "bfloat16", {"seed": 7002}),
}


def make_model(overrides, seed, base):
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(seed)
    cfg = Phi3Config(**{**base, **overrides})
    cfg.architectures = ["Phi3ForCausalLM"]
    model = Phi3ForCausalLM(cfg).eval()
    with torch.no_grad():  # norm weights start at 1
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return model
