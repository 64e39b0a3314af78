"""glm4_moe fixtures (plugins/glm), registered in generate.py.

Tiny random Glm4MoeForCausalLM checkpoints saved by transformers, covering
q/k norm on and off, q/k/v biases, grouped routing (n_group > 1), dense first
layers, routed_scaling_factor != 1, shared experts, bf16 and fp32, a config
without partial_rotary_factor (glm4_moe's default 0.5), the fused expert
layout, and an inlined MTP layer added by file surgery (model.layers.{N},
N = num_hidden_layers, as the GLM-4.x releases store it; transformers saves
num_nextn_predict_layers 1 but no MTP weights, and ignores them on load).

For the MTP fixture, mtp_reference.npz holds the draft's reference: the MTP
layer composed from transformers' own modules (Glm4MoeDecoderLayer with its
cache, Glm4MoeRMSNorm, Glm4MoeRotaryEmbedding, nn.Linear for eh_proj and the
head) wired as vLLM's Glm4MoeMultiTokenPredictorLayer runs it, fed the main
model's final-norm hidden states, over a prefill and decode steps.
"""

import json
import os

import numpy as np
import torch

# Sizes on top of generate.BASE. 8 experts in 4 groups of 2 (the group score
# is the sum of the best two), 12 experts for two-digit indices.
GLM = dict(head_dim=16, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
           first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0,
           use_qk_norm=False, attention_bias=True, num_key_value_heads=2)

GLM_SPEC = {
    # name: (config overrides, dtype, options); explicit seeds.
    "glm-f32-qknorm-groups": (dict(num_hidden_layers=3, use_qk_norm=True, n_group=4, topk_group=2, num_experts_per_tok=3,
                                   routed_scaling_factor=2.5), "float32", {"seed": 3001}),
    "glm-bf16-dense2-shared2": (dict(num_hidden_layers=3, first_k_dense_replace=2, n_routed_experts=12, num_experts_per_tok=4,
                                     n_shared_experts=2, norm_topk_prob=False, n_group=2, topk_group=1,
                                     routed_scaling_factor=1.5), "bfloat16", {"seed": 3002, "drop_partial_rotary": True}),
    "glm-f32-fused": (dict(num_hidden_layers=2, use_qk_norm=True, attention_bias=False, n_group=2, topk_group=2,
                           routed_scaling_factor=2.0), "float32", {"seed": 3003, "fused_experts": True}),
    "glm-f32-mtp": (dict(num_hidden_layers=2, use_qk_norm=True, n_group=2, topk_group=1, routed_scaling_factor=2.5),
                    "float32", {"seed": 3004, "mtp_layer": {"own_head": True, "own_embed": False}}),
    "glm-bf16-mtp-own-embed": (dict(num_hidden_layers=2, first_k_dense_replace=1, n_group=1, topk_group=1,
                                    routed_scaling_factor=1.8, norm_topk_prob=False),
                               "bfloat16", {"seed": 3005, "mtp_layer": {"own_head": False, "own_embed": True}}),
}


def config(overrides, base):
    from transformers import Glm4MoeConfig

    cfg = Glm4MoeConfig(**{**base, **GLM, **overrides})
    cfg.architectures = ["Glm4MoeForCausalLM"]
    return cfg


def randomize(module):
    """Norm weights away from 1, biases away from 0, a correction bias that
    shifts the expert choice (transformers starts it at zero)."""
    with torch.no_grad():
        for n, p in module.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            if n.endswith(".bias"):
                p.normal_(0.0, 0.2)
        for n, b in module.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.rand(b.shape) * 0.2)
    return module


def make_model(overrides, seed, base):
    from transformers import Glm4MoeForCausalLM

    torch.manual_seed(seed)
    return randomize(Glm4MoeForCausalLM(config(overrides, base)).eval())


def post_save(out, options):
    """Edits after save_pretrained: the options of GLM_SPEC."""
    if options.get("drop_partial_rotary"):
        path = os.path.join(out, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        assert cfg["rope_parameters"].pop("partial_rotary_factor") == 0.5
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
    if options.get("mtp_layer"):
        add_mtp_layer(out, options["mtp_layer"])


def mtp_modules(cfg):
    """The MTP layer as transformers modules: the decoder layer (a MoE layer:
    its index is num_hidden_layers ≥ first_k_dense_replace) and the NextN
    parts, random."""
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer, Glm4MoeRMSNorm

    return nextn_modules(cfg, Glm4MoeDecoderLayer, Glm4MoeRMSNorm)


def nextn_modules(cfg, layer_cls, norm_cls):
    """A DeepSeek-style MTP layer of layer_cls (at index num_hidden_layers,
    with its own one-layer cache) and norm_cls: mtp_block, enorm, hnorm,
    eh_proj, shared_head.norm / .head, embed_tokens."""
    from torch import nn

    h, eps = cfg.hidden_size, cfg.rms_norm_eps
    cfg._attn_implementation = "eager"
    mods = nn.ModuleDict(dict(
        mtp_block=layer_cls(cfg, layer_idx=cfg.num_hidden_layers),
        enorm=norm_cls(h, eps), hnorm=norm_cls(h, eps),
        eh_proj=nn.Linear(2 * h, h, bias=False),
        shared_head=nn.ModuleDict(dict(norm=norm_cls(h, eps), head=nn.Linear(h, cfg.vocab_size, bias=False))),
        embed_tokens=nn.Embedding(cfg.vocab_size, h)))
    mods.mtp_block.self_attn.layer_idx = 0  # its own one-layer cache
    return mods


def random_mtp(out, make_modules, seed, norm_low):
    """What MTP surgery starts from: the saved checkpoint's config, path,
    tensors and dtype, and make_modules(cfg) random (norm weights in
    [norm_low, norm_low + 1), biases around 0), with the generator."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(out)
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    g = torch.Generator().manual_seed(seed)
    mods = make_modules(cfg)
    with torch.no_grad():
        for name, p in mods.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * cfg.initializer_range)
            if "norm" in name:
                p.copy_(norm_low + torch.rand(p.shape, generator=g))
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return cfg, path, tensors, tensors["model.embed_tokens.weight"].dtype, mods, g


def add_mtp_layer(out, opts, make_modules=None, seed=77):
    """Adds model.layers.{N}.* (N = num_hidden_layers) to the checkpoint with
    the GLM-4.x release names: the decoder layer's keys as for any MoE layer
    (per-expert), then enorm, hnorm, eh_proj, shared_head.norm, and, as
    asked, shared_head.head and embed_tokens (GLM-4.6 omits those two).
    make_modules (cfg -> the modules, mtp_modules by default) names them as
    mtp_modules does (gen_deepseek's for DeepSeek-V3 and GLM-4.7-Flash)."""
    from safetensors.torch import save_file

    cfg, path, tensors, dtype, mods, g = random_mtp(out, make_modules or mtp_modules, seed, 0.5)
    n = cfg.num_hidden_layers
    with torch.no_grad():
        mods.mtp_block.mlp.gate.e_score_correction_bias.copy_(torch.rand(cfg.n_routed_experts, generator=g) * 0.2)
    skip = {"embed_tokens"} if not opts.get("own_embed") else set()
    if not opts.get("own_head"):
        skip.add("shared_head.head")
    prefix = f"model.layers.{n}."
    for name, t in mods.state_dict().items():
        if any(name.startswith(s + ".") for s in skip):
            continue
        name = name.removeprefix("mtp_block.")
        if per_expert(tensors, prefix, name, t, cfg.moe_intermediate_size, dtype):
            continue
        keep32 = "mlp.gate." in name  # _keep_in_fp32_modules_strict, as save_pretrained writes them
        tensors[prefix + name] = t.to(torch.float32 if keep32 else dtype).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def per_expert(tensors, prefix, name, t, intermediate, dtype):
    """Writes a fused expert tensor (transformers' in-memory gate_up_proj
    [E, 2I, H] or down_proj [E, H, I]) into tensors as the releases' per-expert
    keys under prefix; False for any other tensor."""
    if name.endswith("mlp.experts.gate_up_proj"):
        for e in range(t.shape[0]):
            tensors[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = t[e, :intermediate].to(dtype).contiguous()
            tensors[f"{prefix}mlp.experts.{e}.up_proj.weight"] = t[e, intermediate:].to(dtype).contiguous()
        return True
    if name.endswith("mlp.experts.down_proj"):
        for e in range(t.shape[0]):
            tensors[f"{prefix}mlp.experts.{e}.down_proj.weight"] = t[e].to(dtype).contiguous()
        return True
    return False


def fused_experts(t, prefix, experts):
    """The per-expert keys under prefix stacked back as transformers holds
    them: {"mlp.experts.gate_up_proj": [E, 2I, H], "mlp.experts.down_proj": [E, H, I]}."""
    return {"mlp.experts.gate_up_proj": torch.stack([torch.cat([t[f"{prefix}mlp.experts.{x}.gate_proj.weight"],
                                                                 t[f"{prefix}mlp.experts.{x}.up_proj.weight"]]) for x in range(experts)]),
            "mlp.experts.down_proj": torch.stack([t[f"{prefix}mlp.experts.{x}.down_proj.weight"] for x in range(experts)])}


def load_mtp(model_dir, cfg, layer, make_modules=None):
    """The MTP modules (make_modules(cfg), mtp_modules by default) with the
    checkpoint's layer-N tensors (float32); the main embedding / lm_head
    where the layer has none of its own."""
    from safetensors.torch import load_file

    t = {k: v.float() for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    prefix = f"model.layers.{layer}."
    mods = (make_modules or mtp_modules)(cfg)
    state = {}
    for k, v in t.items():
        if k.startswith(prefix) and ".mlp.experts." not in k:
            name = k.removeprefix(prefix)
            state[name if name.split(".")[0] in ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens") else "mtp_block." + name] = v
    state.update({"mtp_block." + k: v for k, v in fused_experts(t, prefix, cfg.n_routed_experts).items()})
    state.setdefault("embed_tokens.weight", t["model.embed_tokens.weight"])
    state.setdefault("shared_head.head.weight", t["lm_head.weight"])
    missing, unexpected = mods.load_state_dict(state, strict=False)
    assert not unexpected and all(m.endswith("e_score_correction_bias") is False for m in missing), (missing, unexpected)
    assert not missing, missing
    return mods.eval()


class Draft:
    """One sequence through the MTP layer, as vLLM runs it, with its cache.
    mods are named as GLM's MTP layer is (embed_tokens, enorm, hnorm,
    eh_proj, mtp_block, shared_head.norm / .head); zero_first zeroes the
    embedding at position 0 (vLLM's GLM MTP does, Qwen3-Next's does not)."""

    def __init__(self, mods, rope, zero_first=True):
        from transformers import DynamicCache

        self.m, self.rope, self.cache, self.past, self.zero_first = mods, rope, DynamicCache(), 0, zero_first

    @torch.no_grad()
    def __call__(self, ids, hidden):
        t = len(ids)
        pos = torch.arange(self.past, self.past + t)[None]
        emb = self.m.embed_tokens(torch.tensor([ids]))
        if self.zero_first:
            emb = torch.where((pos == 0)[..., None], torch.zeros_like(emb), emb)
        x = self.m.eh_proj(torch.cat([self.m.enorm(emb), self.m.hnorm(hidden)], dim=-1))
        keys = torch.arange(self.past + t)
        mask = torch.where(keys[None, :] <= pos[0][:, None], 0.0, float("-inf"))[None, None]
        y = self.m.mtp_block(x, attention_mask=mask, position_ids=pos, cache=self.cache, use_cache=True,
                             position_embeddings=self.rope(x, pos))
        self.past += t
        return self.m.shared_head.head(self.m.shared_head.norm(y[:, -1]))[0]


def glm_draft(model_dir, cfg, main):
    """A fresh GLM draft (Draft) per sequence."""
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding

    mods, rope = load_mtp(model_dir, cfg, cfg.num_hidden_layers), Glm4MoeRotaryEmbedding(cfg)
    return lambda: Draft(mods, rope)


@torch.no_grad()
def mtp_reference(dest, new_draft=glm_draft):
    """mtp_reference.npz: per row, the draft's prefill over the prompt
    (input_ids = the prompt shifted by one, then the first decode token;
    hidden states = the main model's at positions 0..n-1), then one step per
    decode token d[s+1] at position n+s with the main hidden state after
    d[s]. Also the main model's final-norm hidden states."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = os.path.join(dest, "model")
    ref = np.load(os.path.join(dest, "reference.npz"))
    cfg = AutoConfig.from_pretrained(model_dir)
    main = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    draft = new_draft(model_dir, cfg, main)
    prompts, lengths, decode = ref["prompts"], ref["prompt_lengths"], ref["decode_tokens"]
    steps = decode.shape[1]
    width = prompts.shape[1]
    hidden_prefill = np.zeros((len(lengths), width, cfg.hidden_size), np.float32)
    hidden_decode = np.zeros((steps, len(lengths), cfg.hidden_size), np.float32)
    draft_logits = [[] for _ in range(steps)]
    for b, n in enumerate(lengths):
        prompt = prompts[b, :n].tolist()
        out = main.model(input_ids=torch.tensor([prompt]), use_cache=True)
        hs, past = [out.last_hidden_state], out.past_key_values
        for s in range(steps):
            out = main.model(input_ids=torch.tensor([[int(decode[b, s])]]), past_key_values=past, use_cache=True)
            hs.append(out.last_hidden_state)
            past = out.past_key_values
        hidden_prefill[b, :n] = hs[0][0].numpy()
        for s in range(steps):
            hidden_decode[s, b] = hs[s + 1][0, 0].numpy()
        d = draft()
        draft_logits[0].append(d(prompt[1:] + [int(decode[b, 0])], hs[0]).numpy())
        for s in range(steps - 1):
            draft_logits[s + 1].append(d([int(decode[b, s + 1])], hs[s + 1]).numpy())
    np.savez_compressed(os.path.join(dest, "mtp_reference.npz"), hidden_prefill=hidden_prefill, hidden_decode=hidden_decode,
                        draft_logits=np.stack([np.stack(x) for x in draft_logits]).astype(np.float32), mtp_layer=cfg.num_hidden_layers)
    print(f"{os.path.basename(dest)}: MTP draft reference, {steps} calls")


def generate_extras(fixtures, names):
    for name, (_, _, options) in GLM_SPEC.items():
        if name in names and options.get("mtp_layer"):
            mtp_reference(os.path.join(fixtures, name))
