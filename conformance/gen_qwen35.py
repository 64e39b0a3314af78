"""Qwen3.5 / Qwen3-Next fixtures (plugins/qwen35), registered in generate.py.

Tiny random hybrid checkpoints saved by transformers: layer_types mixes
gated-DeltaNet linear attention (conv_state, recurrent_state caches) and
gated full attention (the KV cache); layer 0 is a linear layer, so the
context part must find its cache elsewhere. 2 key heads over 4 value heads
(the key heads repeat), conv kernel 4 (shorter than the 7-token prompt),
partial rotary 0.25.

- qwen35-f32-dense: Qwen3_5ForCausalLM (qwen3_5_text), dense MLPs, 4
  layers (linear, linear, full, linear), GQA 2, head_dim 32.
- qwen35moe-bf16: Qwen3_5MoeForCausalLM (qwen3_5_moe_text), every layer
  MoE (8 experts, top 2, always renormalised) with a gated shared expert,
  3 layers (linear, full, linear).
- qwen3next-f32: Qwen3NextForCausalLM, in_proj_qkvz / in_proj_ba fused per
  key head, 4 layers (linear, linear, full, linear), mlp_only_layers [0]
  (a dense layer), norm_topk_prob false.
- qwen35moe-mm-bf16: Qwen3_5MoeForConditionalGeneration (qwen3_5_moe), the
  language model of the natively multimodal release layout: text_config,
  keys under model.language_model., lm_head.weight top level, MRoPE
  parameters (mrope_section, interleaved) as the Hub configs carry them, a
  tiny vision tower not exported. The reference is the text-only logits.
- qwen3next-bf16: Qwen3NextForCausalLM, 3 layers (linear, full, linear),
  decoder_sparse_step 2 (layer 1 sparse), norm_topk_prob true.
- qwen35-mm-f32-vision, qwen35moe-mm-f32-vision: Qwen3_5ForConditionalGeneration
  and Qwen3_5MoeForConditionalGeneration with a tiny vision tower (Qwen3-VL's
  fixtures' without DeepStack) and image prompts, made and referenced by
  gen_qwen3vl.generate_fixture (vision.npz: get_image_features;
  vision_prompts.npz: logits with pixel_values, get_rope_index). The dense
  one has no mrope_section (transformers' default [11, 11, 10] over the
  8 rotary frequencies of head_dim 64), the MoE one [2, 1, 1].

Every (1 + w) norm weight is randomised around 0, the gated norm's around
1, dt_bias around 0, and A_log from log(U(0.05, 1)) so the decays keep
some state across tokens.
"""

import torch

import gen_qwen3vl

LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
              linear_conv_kernel_dim=4)
ROPE = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25)
MROPE = dict(ROPE, mrope_section=[2, 1, 1], mrope_interleaved=True)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
L, F = "linear_attention", "full_attention"
# Qwen3-VL's fixtures' vision tower without DeepStack (Qwen3.5 has none).
VISION = {k: v for k, v in gen_qwen3vl.VISION.items() if k != "deepstack_visual_indexes"}

QWEN35_SPEC = {
    # name: (config overrides on generate.BASE, dtype, options); explicit seeds.
    "qwen35-f32-dense": (dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=32, layer_types=[L, L, F, L],
                              rope_parameters=ROPE, **LINEAR), "float32", {"seed": 9001}),
    "qwen35moe-bf16": (dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16, layer_types=[L, F, L],
                            rope_parameters=ROPE, **LINEAR, **MOE), "bfloat16", {"seed": 9012}),
    "qwen3next-f32": (dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=16, layer_types=[L, L, F, L],
                           mlp_only_layers=[0], norm_topk_prob=False, rope_parameters=ROPE, **LINEAR, **MOE),
                      "float32", {"seed": 9003}),
    # overrides: text_config (on generate.BASE), vision_config, top-level fields.
    "qwen35moe-mm-bf16": (dict(text_config=dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=32,
                                                layer_types=[L, F, L], rope_parameters=MROPE, **LINEAR, **MOE),
                               vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                                                  out_hidden_size=64, num_position_embeddings=16),
                               top=dict(tie_word_embeddings=False)), "bfloat16", {"seed": 9005}),
    "qwen35-mm-f32-vision": (dict(text_config=dict(num_hidden_layers=4, num_key_value_heads=2, head_dim=64,
                                                   layer_types=[L, F, L, F], rope_parameters=ROPE, **LINEAR),
                                  vision_config=VISION, top=dict(tie_word_embeddings=False, **gen_qwen3vl.VISION_TOKENS)),
                             "float32", {"seed": 9006, "vision_prompts": True}),
    "qwen35moe-mm-f32-vision": (dict(text_config=dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=32,
                                                      layer_types=[L, F, L], rope_parameters=MROPE, **LINEAR, **MOE),
                                     vision_config=VISION, top=dict(tie_word_embeddings=True, **gen_qwen3vl.VISION_TOKENS)),
                                "float32", {"seed": 9007, "vision_prompts": True}),
    "qwen3next-bf16": (dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16, layer_types=[L, F, L],
                            decoder_sparse_step=2, rope_parameters=ROPE, **LINEAR, **MOE), "bfloat16", {"seed": 9004}),
}


def make_model(name, overrides, seed, base):
    import transformers

    torch.manual_seed(seed)
    kinds = {"qwen35-": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
             "qwen35moe-": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
             "qwen3next-": ("Qwen3NextConfig", "Qwen3NextForCausalLM")}
    if "text_config" in overrides:
        return make_multimodal(name, overrides, base)
    config_cls, model_cls = next(v for k, v in sorted(kinds.items(), key=lambda kv: -len(kv[0])) if name.startswith(k))
    fields = {**base, **overrides}
    if config_cls == "Qwen3_5MoeTextConfig":
        fields.pop("intermediate_size")
    cfg = getattr(transformers, config_cls)(**fields)
    cfg.architectures = [model_cls]
    return randomized(getattr(transformers, model_cls)(cfg).eval())


def make_multimodal(name, overrides, base):
    """A Qwen3_5(Moe)ForConditionalGeneration: the text model's fields in
    text_config, its keys under model.language_model., a tiny vision tower
    (model.visual.*)."""
    import transformers

    moe = name.startswith("qwen35moe-")
    text = {**base, **overrides["text_config"]}
    if moe:
        text.pop("intermediate_size")
    prefix = "Qwen3_5Moe" if moe else "Qwen3_5"
    cfg = getattr(transformers, prefix + "Config")(text_config=text, vision_config=overrides["vision_config"],
                                                   **overrides["top"])
    cfg.architectures = [prefix + "ForConditionalGeneration"]
    return randomized(getattr(transformers, prefix + "ForConditionalGeneration")(cfg).eval())


def generate_vision_fixture(dest, name, overrides, dtype, options, base):
    """A fixture with image prompts, as gen_qwen3vl makes Qwen3-VL's."""
    make = lambda: make_model(name, overrides, options["seed"], base)  # noqa: E731
    # options["top"]: the special tokens the text prompts stay below.
    gen_qwen3vl.generate_fixture(dest, name, overrides, dtype, {**options, "top": overrides["top"]}, make=make)


def randomized(model):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("linear_attn.norm.weight"):
                p.uniform_(0.5, 1.5)
            elif "norm" in n:
                p.uniform_(-0.5, 0.5)
            elif n.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
            elif n.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.05, 1.0).log())
    return model
