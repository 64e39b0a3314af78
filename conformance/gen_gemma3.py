"""Gemma-3 fixtures (plugins/gemma3), registered in generate.py.

Tiny random Gemma3ForCausalLM (model_type gemma3_text) checkpoints saved by
transformers:

- gemma3-f32-sliding: 4 layers, layer_types sliding, sliding, full, sliding
  with sliding_window 4, shorter than the prompts (7 and 4), so the prefill
  and the decode steps cross it; the sliding layers turn at the local RoPE
  base (1e4), the full layer at rope_theta (1e6); GQA 2, head_dim 24 (hidden /
  heads is 16), query_pre_attn_scalar 20 (not head_dim), attention_bias.
- gemma3-bf16-scaled: 3 layers, linear rope scaling (factor 8) on the full
  layers only, 8 heads over 2 KV heads, head_dim 16, query_pre_attn_scalar
  32, sliding_window 3.
- gemma3-f32-softcap: 2 layers (sliding, full; sliding_window 4) with
  final_logit_softcapping 3.0, small enough that the capped logits differ
  from the raw ones well past the tolerance, and attn_logit_softcapping 5.0,
  which transformers' Gemma-3 attention ignores (it never passes softcap
  on), so the export must ignore it too.

Gemma's RMSNorms weigh by 1 + w and start at w = 0; every norm weight
(input, post-attention, pre-/post-feedforward, q/k, final) is randomised
around 0, so a norm taken as w, or missing, shows in the logits. The
embeddings are tied (Gemma3TextConfig's default).

- gemma3-mm-f32: a tiny Gemma3ForConditionalGeneration (model_type gemma3:
  the text model's fields in text_config, its keys under
  model.language_model., a tiny SigLIP vision tower and projector present
  but not exported), untied (top-level tie_word_embeddings false, so
  lm_head.weight is top level), 3 layers (sliding, full, sliding;
  sliding_window 4), GQA 2, and text_config.final_logit_softcapping 3.0,
  which Gemma3ForConditionalGeneration (unlike Gemma3ForCausalLM) never
  applies. The reference is the text-only logits (AutoModelForCausalLM loads
  Gemma3ForConditionalGeneration for model_type gemma3).

The other key layouts transformers loads a Gemma3ForConditionalGeneration
from (generate.rekey rewrites the saved file; transformers loads it back
into the same logits before the reference is taken from it):

- gemma3-mm-f32-memory-keys: gemma3-mm-f32 (same config and seed, so the
  same logits) as transformers ≥ 4.52 holds it in memory and tools saving
  its state_dict write it: model.language_model.*, lm_head.weight,
  model.vision_tower.*, model.multi_modal_projector.*.
- gemma3-mm-f32-base-keys: a Gemma3Model's layout (language_model.*,
  vision_tower.*; no head: tied embeddings, Gemma3Config's default), 2
  layers (full, sliding).
- gemma3-mm-bf16-doubled-keys: the doubled model.language_model.model.*
  prefix (transformers 5.10-5.23 saves; its legacy renaming reads it) with
  lm_head.weight, bf16, 3 layers.
"""

import torch

GEMMA3_SPEC = {
    # name: (config overrides on generate.BASE, dtype, options); explicit seeds.
    "gemma3-f32-sliding": (dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=20,
                                attention_bias=True, sliding_window=4,
                                layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                             "sliding_attention"]), "float32", {"seed": 8001}),
    "gemma3-bf16-scaled": (dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                                query_pre_attn_scalar=32, sliding_window=3,
                                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                rope_parameters=dict(
                                    full_attention=dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
                                    sliding_attention=dict(rope_type="default", rope_theta=10000.0))),
                           "bfloat16", {"seed": 8002}),
    "gemma3-f32-softcap": (dict(num_hidden_layers=2, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                                sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
                           "float32", {"seed": 8003}),
    # overrides: text_config (on generate.BASE), vision_config, top-level fields.
    "gemma3-mm-f32": (dict(text_config=dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
                                            query_pre_attn_scalar=16, sliding_window=4,
                                            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                            final_logit_softcapping=3.0),
                           vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                              num_attention_heads=2, image_size=16, patch_size=4),
                           top=dict(mm_tokens_per_image=4, tie_word_embeddings=False)),
                      "float32", {"seed": 8004}),
    "gemma3-mm-f32-memory-keys": (None, "float32", {"seed": 8004, "rekey": [
        ["language_model.model.", "model.language_model."], ["language_model.lm_head.", "lm_head."],
        ["vision_tower.", "model.vision_tower."], ["multi_modal_projector.", "model.multi_modal_projector."]]}),
    "gemma3-mm-f32-base-keys": (dict(text_config=dict(num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                                                      query_pre_attn_scalar=16, sliding_window=3,
                                                      layer_types=["full_attention", "sliding_attention"]),
                                     vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                        num_attention_heads=2, image_size=16, patch_size=4),
                                     top=dict(mm_tokens_per_image=4)),
                                "float32", {"seed": 8005, "rekey": [["language_model.model.", "language_model."]]}),
    "gemma3-mm-bf16-doubled-keys": (dict(text_config=dict(num_hidden_layers=3, num_attention_heads=8,
                                                          num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=32,
                                                          sliding_window=4,
                                                          layer_types=["sliding_attention", "sliding_attention",
                                                                       "full_attention"]),
                                         vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                            num_attention_heads=2, image_size=16, patch_size=4),
                                         top=dict(mm_tokens_per_image=4, tie_word_embeddings=False)),
                                    "bfloat16", {"seed": 8006, "rekey": [
                                        ["language_model.model.", "model.language_model.model."],
                                        ["language_model.lm_head.", "lm_head."]]}),
}
GEMMA3_SPEC["gemma3-mm-f32-memory-keys"] = (GEMMA3_SPEC["gemma3-mm-f32"][0], *GEMMA3_SPEC["gemma3-mm-f32-memory-keys"][1:])


def make_model(overrides, seed, base):
    from transformers import Gemma3Config, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3TextConfig

    torch.manual_seed(seed)
    if "text_config" in overrides:
        cfg = Gemma3Config(text_config={**base, **overrides["text_config"]}, vision_config=overrides["vision_config"],
                           **overrides["top"])
        cfg.architectures = ["Gemma3ForConditionalGeneration"]
        model = Gemma3ForConditionalGeneration(cfg).eval()
    else:
        cfg = Gemma3TextConfig(**{**base, **overrides})
        cfg.architectures = ["Gemma3ForCausalLM"]
        model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():  # norm weights start at 0 (the norm weighs by 1 + w), biases at 0
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(-0.5, 0.5)
            if n.endswith(".bias"):
                p.normal_(0.0, 0.2)
    return model
