"""DeepSeek-V3-family fixtures (plugins/deepseek), registered in generate.py.

Tiny random DeepseekV3ForCausalLM and Glm4MoeLiteForCausalLM checkpoints
saved by transformers, covering multi-head latent attention with and without
the q LoRA (q_lora_rank null), interleaved and plain RoPE, yarn with mscale /
mscale_all_dim (the softmax scale), attention biases, grouped routing
(n_group > 1), dense first layers, shared experts, bf16 and fp32, and an
inlined MTP layer (model.layers.{N}, N = num_hidden_layers, as the releases
store it) added by file surgery. v_head_dim differs from qk_nope_head_dim
so that a swapped split shows.

For the MTP fixtures, mtp_reference.npz holds the draft's reference: the
MTP layer composed from transformers' own modules (the decoder layer with
its cache, the RMSNorms, the rotary embedding, nn.Linear for eh_proj and
the head) wired as vLLM's DeepSeekMultiTokenPredictorLayer runs it
(gen_glm.Draft), fed the main model's final-norm hidden states.
"""

import os

import torch

import gen_glm

# Sizes on top of generate.BASE (hidden 64, 4 heads).
MLA = dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
           moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
           n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, first_k_dense_replace=1,
           rope_interleave=True, attention_bias=False)


def yarn(factor=4.0, mscale=1.0, mscale_all_dim=0.8):
    # original_max_position_embeddings small so the ramp moves frequencies.
    return dict(rope_type="yarn", rope_theta=10000.0, factor=factor, mscale=mscale, mscale_all_dim=mscale_all_dim,
                original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0)


DEEPSEEK_SPEC = {
    # name: (config overrides, dtype, options); explicit seeds.
    "deepseek-f32-qlora-groups": (dict(num_hidden_layers=3, n_group=4, topk_group=2, num_experts_per_tok=3,
                                       routed_scaling_factor=2.5, attention_bias=True), "float32", {"seed": 4001}),
    "deepseek-bf16-noqlora-yarn": (dict(num_hidden_layers=3, q_lora_rank=None, first_k_dense_replace=2, rope_interleave=False,
                                        n_routed_experts=12, num_experts_per_tok=4, n_shared_experts=2, norm_topk_prob=False,
                                        n_group=2, topk_group=1, routed_scaling_factor=1.5, rope_parameters=yarn()),
                                   "bfloat16", {"seed": 4002}),
    "deepseek-f32-yarn-mtp": (dict(num_hidden_layers=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                                   rope_parameters=yarn(factor=8.0, mscale=0.707, mscale_all_dim=0.707)),
                              "float32", {"seed": 4003, "mla_mtp_layer": {"own_head": True, "own_embed": False}}),
    "glm4lite-f32-qlora": (dict(num_hidden_layers=3, routed_scaling_factor=1.8, mlp_layer_types=["dense", "sparse", "sparse"]),
                           "float32", {"seed": 4004}),
    "glm4lite-bf16-mtp": (dict(num_hidden_layers=2, num_nextn_predict_layers=1, q_lora_rank=None, n_group=2, topk_group=1, routed_scaling_factor=1.8),
                          "bfloat16", {"seed": 4005, "mla_mtp_layer": {"own_head": False, "own_embed": True}}),
}


def lite(name):
    return name.startswith("glm4lite-")


def config(name, overrides, base):
    from transformers import DeepseekV3Config, Glm4MoeLiteConfig

    params = {**base, **MLA, **overrides}
    if lite(name):
        params.pop("first_k_dense_replace")
        cfg = Glm4MoeLiteConfig(**params)
        cfg.architectures = ["Glm4MoeLiteForCausalLM"]
    else:
        cfg = DeepseekV3Config(**params)
        cfg.architectures = ["DeepseekV3ForCausalLM"]
    return cfg


def make_model(name, overrides, seed, base):
    from transformers import DeepseekV3ForCausalLM, Glm4MoeLiteForCausalLM

    torch.manual_seed(seed)
    cls = Glm4MoeLiteForCausalLM if lite(name) else DeepseekV3ForCausalLM
    return gen_glm.randomize(cls(config(name, overrides, base)).eval())


def post_save(out, options):
    if options.get("mla_mtp_layer"):
        gen_glm.add_mtp_layer(out, options["mla_mtp_layer"], mtp_modules, 78)


def classes(cfg):
    if cfg.model_type == "glm4_moe_lite":
        from transformers.models.glm4_moe_lite import modeling_glm4_moe_lite as mod

        return mod.Glm4MoeLiteDecoderLayer, mod.Glm4MoeLiteRMSNorm, mod.Glm4MoeLiteRotaryEmbedding
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mod

    return mod.DeepseekV3DecoderLayer, mod.DeepseekV3RMSNorm, mod.DeepseekV3RotaryEmbedding


def mtp_modules(cfg):
    """The MTP layer as transformers modules: a MoE decoder layer (its index
    is num_hidden_layers, past the dense ones) and the NextN parts."""
    layer_cls, norm_cls, _ = classes(cfg)
    if cfg.model_type == "glm4_moe_lite":
        n = cfg.num_hidden_layers
        cfg.mlp_layer_types = list(cfg.mlp_layer_types[:n]) + ["sparse"]
    return gen_glm.nextn_modules(cfg, layer_cls, norm_cls)


def new_draft(model_dir, cfg, main):
    mods, rope = gen_glm.load_mtp(model_dir, cfg, cfg.num_hidden_layers, mtp_modules), classes(cfg)[2](cfg)
    return lambda: gen_glm.Draft(mods, rope)


def generate_extras(fixtures, names):
    for name, (_, _, options) in DEEPSEEK_SPEC.items():
        if name in names and options.get("mla_mtp_layer"):
            gen_glm.mtp_reference(os.path.join(fixtures, name), new_draft)
