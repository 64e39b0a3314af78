"""OLMo-2 fixtures (plugins/olmo2), registered in generate.py.

Tiny random Olmo2ForCausalLM checkpoints saved by transformers:

- olmo2-f32-gqa: GQA 2, explicit head_dim 24 (hidden / heads is 16, so the
  all-heads q/k norms' weights, [96] and [48], differ from the hidden size),
  attention_bias (q/k/v/o biases), 3 layers.
- olmo2-bf16-tied: tied embeddings, 8 heads over 2 KV heads, rope_theta
  500000.

Every norm weight (post-attention, post-feedforward, q/k, final) and bias is
randomised, so a norm in the wrong place, over the wrong span, or missing
shows in the logits.
"""

import torch

OLMO2_SPEC = {
    # name: (config overrides on generate.BASE, dtype, options); explicit seeds.
    "olmo2-f32-gqa": (dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=24, attention_bias=True), "float32",
                      {"seed": 6001}),
    "olmo2-bf16-tied": (dict(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
                             rope_parameters=dict(rope_type="default", rope_theta=500000.0)), "bfloat16",
                        {"seed": 6002}),
}


def make_model(overrides, seed, base):
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(seed)
    cfg = Olmo2Config(**{**base, **overrides})
    cfg.architectures = ["Olmo2ForCausalLM"]
    model = Olmo2ForCausalLM(cfg).eval()
    with torch.no_grad():  # norm weights start at 1, biases at 0
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            if n.endswith(".bias"):
                p.normal_(0.0, 0.2)
    return model
