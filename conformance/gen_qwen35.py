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


# MTP fixtures: the MTP layer (mtp.* keys, as every release stores them) is
# added after save_pretrained (transformers neither builds nor loads it).
# qwen3next-f32-mtp: a MoE MTP layer (per-expert keys, shared expert),
# num_nextn_predict_layers as vLLM's Qwen3-Next MTP reads it; qwen35-bf16-mtp:
# a dense one, tied embeddings (the head is the embedding),
# mtp_num_hidden_layers as the Qwen3.5 configs name it.
QWEN35_SPEC.update({
    "qwen3next-f32-mtp": (dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16, layer_types=[L, F, L],
                               decoder_sparse_step=1, num_nextn_predict_layers=1, rope_parameters=ROPE, **LINEAR, **MOE),
                          "float32", {"seed": 9008, "mtp": True}),
    "qwen35-bf16-mtp": (dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=32, layer_types=[L, F, L],
                             mtp_num_hidden_layers=1, tie_word_embeddings=True, rope_parameters=ROPE, **LINEAR),
                        "bfloat16", {"seed": 9007, "mtp": True}),
})


def mtp_modules(cfg):
    """The MTP layer as transformers modules, named as gen_glm.Draft reads
    them: mtp_block the model's decoder layer built as a full-attention
    layer (layer index 0 of a config whose only layer type is full, as vLLM
    builds mtp.layers.0), enorm / hnorm / shared_head.norm the model's
    (1 + w) RMSNorm for pre_fc_norm_embedding / pre_fc_norm_hidden / norm,
    eh_proj nn.Linear for fc; embed_tokens and shared_head.head the main
    model's, filled by load_mtp."""
    import copy

    from torch import nn
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer, Qwen3NextRMSNorm

    layer_cls, norm = {"qwen3_next": (Qwen3NextDecoderLayer, Qwen3NextRMSNorm),
                       "qwen3_5_text": (Qwen3_5DecoderLayer, Qwen3_5RMSNorm)}[cfg.model_type]
    one = copy.deepcopy(cfg)
    one.layer_types, one.mlp_only_layers = ["full_attention"], []
    one._attn_implementation = "eager"
    h, eps = cfg.hidden_size, cfg.rms_norm_eps
    return nn.ModuleDict(dict(
        mtp_block=layer_cls(one, layer_idx=0), enorm=norm(h, eps), hnorm=norm(h, eps),
        eh_proj=nn.Linear(2 * h, h, bias=False),
        shared_head=nn.ModuleDict(dict(norm=norm(h, eps), head=nn.Linear(h, cfg.vocab_size, bias=False))),
        embed_tokens=nn.Embedding(cfg.vocab_size, h)))


# Checkpoint names of the MTP parts outside the decoder layer.
MTP_NAMES = {"enorm": "mtp.pre_fc_norm_embedding", "hnorm": "mtp.pre_fc_norm_hidden", "eh_proj": "mtp.fc",
             "shared_head.norm": "mtp.norm"}


def checkpoint_name(name):
    """The release key of an mtp_modules parameter (None: the main model's)."""
    if name.startswith("mtp_block."):
        return "mtp.layers.0." + name.removeprefix("mtp_block.")
    for part, key in MTP_NAMES.items():
        if name.startswith(part + "."):
            return key + name.removeprefix(part)
    return None


def add_mtp(out):
    """Adds random mtp.* tensors to the saved checkpoint: (1 + w) norms
    around 0, the decoder layer's experts per expert."""
    from safetensors.torch import save_file

    import gen_glm

    cfg, path, tensors, dtype, mods, _ = gen_glm.random_mtp(out, mtp_modules, 78, -0.5)
    for name, t in mods.state_dict().items():
        key = checkpoint_name(name)
        if key is None or gen_glm.per_expert(tensors, "mtp.layers.0.", key, t, getattr(cfg, "moe_intermediate_size", 0), dtype):
            continue
        tensors[key] = t.to(dtype).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def post_save(out, options):
    if options.get("mtp"):
        add_mtp(out)


def load_mtp(model_dir, cfg, main):
    """mtp_modules with the checkpoint's mtp.* tensors (float32) and the
    main model's embedding and head."""
    import os

    from safetensors.torch import load_file

    import gen_glm

    t = {k: v.float() for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    mods = mtp_modules(cfg)
    state = {}
    for name in mods.state_dict():
        key = checkpoint_name(name)
        if key in t:
            state[name] = t[key]
    if hasattr(cfg, "num_experts"):
        state.update({"mtp_block." + k: v for k, v in gen_glm.fused_experts(t, "mtp.layers.0.", cfg.num_experts).items()})
    state["embed_tokens.weight"] = main.model.embed_tokens.weight.detach()
    state["shared_head.head.weight"] = main.lm_head.weight.detach()
    missing, unexpected = mods.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return mods.eval()


def qwen_draft(model_dir, cfg, main):
    """A fresh draft per sequence (gen_glm.Draft): no zeroing at position 0,
    the main model's rotary embedding."""
    import gen_glm

    mods = load_mtp(model_dir, cfg, main)
    return lambda: gen_glm.Draft(mods, main.model.rotary_emb, zero_first=False)


def generate_extras(fixtures, names):
    import os

    import gen_glm

    for name, (_, _, options) in QWEN35_SPEC.items():
        if name in names and options.get("mtp"):
            gen_glm.mtp_reference(os.path.join(fixtures, name), new_draft=qwen_draft)
