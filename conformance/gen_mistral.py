"""mistral fixtures (plugins/mistral), registered in generate.py.

Tiny random MistralForCausalLM checkpoints saved by transformers:

- mistral-f32-sliding: sliding_window 4, shorter than the prompts (7 and 4),
  so the prefill, the decode steps past it and a chunked prefill all cross
  it; GQA 2, 3 layers.
- mistral-bf16-full: sliding_window null (full attention), explicit head_dim
  24 (hidden / heads is 16), rope_theta 1e6.
- mistral-bf16-defaults-tied: config.json without sliding_window and
  num_key_value_heads, so MistralConfig's defaults apply (4096 and 8, not
  full attention and the heads), tied embeddings, explicit head_dim 8 (hidden
  / heads is 4), rope in rope_theta.

generate_extras checks each checkpoint against transformers run other ways
(no cache over the whole sequence; the prompt fed in chunks of window + 1
through transformers' own sliding cache): the same logits, so the reference
does not depend on how transformers' cache keeps the window.
"""

import json
import os

import numpy as np
import torch

MISTRAL_SPEC = {
    # name: (config overrides on generate.BASE, dtype, options); explicit seeds.
    "mistral-f32-sliding": (dict(num_hidden_layers=3, num_key_value_heads=2, sliding_window=4), "float32",
                            {"seed": 5001}),
    "mistral-bf16-full": (dict(num_key_value_heads=2, head_dim=24, sliding_window=None,
                               rope_parameters=dict(rope_type="default", rope_theta=1000000.0)), "bfloat16",
                          {"seed": 5002}),
    # num_key_value_heads 8 and sliding_window 4096 are MistralConfig's
    # defaults: dropped from config.json, they must be read back as such.
    "mistral-bf16-defaults-tied": (dict(num_attention_heads=16, num_key_value_heads=8, head_dim=8, sliding_window=4096,
                                        tie_word_embeddings=True), "bfloat16",
                                   {"seed": 5003, "legacy_rope_config": True,
                                    "drop_fields": ["num_key_value_heads", "sliding_window"]}),
}


def make_model(overrides, seed, base):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    cfg = MistralConfig(**{**base, **overrides})
    cfg.architectures = ["MistralForCausalLM"]
    model = MistralForCausalLM(cfg).eval()
    with torch.no_grad():  # norm weights start at 1; randomise them so a swapped or missing norm shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return model


def post_save(out, options):
    """Edits after save_pretrained: drop_fields are removed from config.json
    (MistralConfig's defaults then apply), checked to read back the same."""
    if not options.get("drop_fields"):
        return
    from transformers import AutoConfig

    path = os.path.join(out, "config.json")
    saved = AutoConfig.from_pretrained(out)
    with open(path) as f:
        cfg = json.load(f)
    for field in options["drop_fields"]:
        del cfg[field]
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    back = AutoConfig.from_pretrained(out)
    for field in options["drop_fields"]:
        assert getattr(back, field) == getattr(saved, field), (field, getattr(back, field), getattr(saved, field))


@torch.no_grad()
def cross_check(fixture_dir, chunk):
    """transformers' logits of the fixture's sequences computed without a
    cache over prompt + decode tokens, and with the prompt fed in chunks of
    chunk tokens, against the recorded reference (a prefill, then
    one token per step)."""
    from transformers import AutoModelForCausalLM

    ref = np.load(os.path.join(fixture_dir, "reference.npz"))
    model = AutoModelForCausalLM.from_pretrained(os.path.join(fixture_dir, "model"), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    whole, chunked = 0.0, 0.0
    for b, n in enumerate(ref["prompt_lengths"]):
        seq = torch.tensor([list(ref["prompts"][b, :n]) + list(ref["decode_tokens"][b])])
        logits = model(input_ids=seq, use_cache=False).logits[0, n - 1:].numpy()
        whole = max(whole, np.abs(logits - ref["logits"][:, b]).max())
        cache, last = None, None
        for start in range(0, int(n), chunk):
            out = model(input_ids=seq[:, start:min(n, start + chunk)], past_key_values=cache, use_cache=True)
            cache, last = out.past_key_values, out.logits[0, -1].numpy()
        chunked = max(chunked, np.abs(last - ref["logits"][0, b]).max())
    return whole, chunked


# Chunks of the sliding fixture's window + 1: the second chunk's queries
# reach back into the first.
CHUNK = 5


def generate_extras(fixtures, names):
    for name in MISTRAL_SPEC:
        if name in names:
            whole, chunked = cross_check(os.path.join(fixtures, name), CHUNK)
            print(f"  {name}: transformers without a cache: max |Δlogits| {whole:.2e}; "
                  f"prefill in chunks of {CHUNK}: {chunked:.2e}")
            assert whole <= 1e-4 and chunked <= 1e-4, (whole, chunked)  # summation order only
