"""Qwen3-VL / Qwen3-VL-MoE fixtures (plugins/qwen3vl): tiny random
Qwen3VLForConditionalGeneration / Qwen3VLMoeForConditionalGeneration
checkpoints saved by transformers, with the text-only logits transformers
computes (prefill + decode, one sequence at a time, as generate.reference).

The vision tower is tiny and present (the checkpoint is a whole Qwen3-VL
one); the text model has interleaved MRoPE sections that use all three rows
(head_dim 16: mrope_section [4, 2, 2]).

Expert orientations: transformers 5 saves the fused experts as it holds them,
gate_up_proj [E, 2I, H], down_proj [E, H, I]; the Hub releases store
[E, H, 2I] / [E, I, H]. "hub_experts" rewrites the saved file in the Hub
orientation (a transpose of the two tensors of every layer, nothing else),
and the reference is computed by transformers loading that file back (its
loader transposes them again), checked equal to the original model's.
"""

import json
import os
import shutil

import numpy as np
import torch
import transformers


def helpers():
    """generate.py (imported late: it imports this module)."""
    import generate

    return generate

TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
            initializer_range=0.25, bos_token_id=1, eos_token_id=2,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2],
                                 mrope_interleaved=True))
VISION = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
              spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16, deepstack_visual_indexes=[0, 2],
              in_channels=3)
# vision.npz: two images of different grids (t, h, w in patches), the second
# with two frames (attention stays within a frame), for vision.onnx against
# transformers' get_image_features.
VISION_GRIDS = [[1, 4, 4], [2, 2, 6]]
# hidden 64 ≠ 2 × 24: the fused experts' orientation shows in their shapes.
MOE = dict(moe_intermediate_size=24, num_experts=6, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[])

# Special tokens inside the tiny vocabulary (the Hub ids are past it), for
# the fixtures with image prompts; their text tokens stay below them.
VISION_TOKENS = dict(image_token_id=124, vision_start_token_id=125, vision_end_token_id=126, video_token_id=127)
# vision_prompts.npz: a batch of two prompts with images (a text token is
# "t", an image k is its image tokens between vision_start and vision_end),
# row-major over the batch: images[k] is the grid of image k.
PROMPT_IMAGES = [[1, 4, 4], [2, 2, 6], [1, 2, 2]]
PROMPT_LAYOUT = [["t", "t", "t", 0, "t", "t"], ["t", 1, "t", 2, "t"]]

QWEN3VL_SPEC = {
    # name: (text_config overrides, dtype, options); top-level config keys under options["top"]
    "qwen3vl-f32-dense": (dict(), "float32", {"seed": 3001}),
    "qwen3vl-bf16-dense-tied": (dict(num_hidden_layers=3, num_attention_heads=8, attention_bias=True), "bfloat16",
                                {"seed": 3002, "top": {"tie_word_embeddings": True}}),
    "qwen3vl-moe-f32-mixed": (dict(MOE, num_hidden_layers=3, mlp_only_layers=[1]), "float32", {"seed": 3003}),
    "qwen3vl-moe-f32-hub": (dict(MOE, num_hidden_layers=3, mlp_only_layers=[1]), "float32",
                            {"seed": 3003, "hub_experts": True}),
    "qwen3vl-moe-bf16-hub-sparse": (dict(MOE, num_hidden_layers=4, num_experts=12, num_experts_per_tok=4,
                                         decoder_sparse_step=2, norm_topk_prob=False), "bfloat16",
                                    {"seed": 3004, "hub_experts": True}),
    # With image prompts (vision_prompts.npz) for model.onnx's vision inputs.
    "qwen3vl-f32-dense-vision": (dict(), "float32", {"seed": 3005, "top": VISION_TOKENS, "vision_prompts": True}),
    "qwen3vl-moe-f32-vision": (dict(MOE, num_hidden_layers=3, mlp_only_layers=[1]), "float32",
                               {"seed": 3006, "top": VISION_TOKENS, "vision_prompts": True}),
    # MRoPE sections as transformers' Qwen3-VL reads them: none in the rope
    # parameters (its default [24, 20, 20], far past head_dim 16's 8
    # frequencies: the H and W strides clip), and one not summing to 8.
    "qwen3vl-f32-mrope-default": (dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0)), "float32",
                                  {"seed": 3009, "top": VISION_TOKENS, "vision_prompts": True}),
    "qwen3vl-f32-mrope-clipped": (dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                            mrope_section=[1, 3, 3], mrope_interleaved=True)),
                                  "float32", {"seed": 3010, "top": VISION_TOKENS, "vision_prompts": True}),
    # Other key layouts transformers loads (generate.rekey): a Qwen3VLModel's
    # (no model. before the language model or the vision tower) with the
    # head; the doubled .model.model. prefix its legacy renaming reads
    # (transformers 5.10-5.23 saves).
    "qwen3vl-f32-dense-base-keys": (dict(num_hidden_layers=3), "float32",
                                    {"seed": 3007, "rekey": [["model.language_model.", "language_model."],
                                                             ["model.visual.", "visual."]]}),
    "qwen3vl-moe-bf16-doubled-keys": (dict(MOE, num_hidden_layers=2), "bfloat16",
                                      {"seed": 3008, "hub_experts": True,
                                       "rekey": [["model.language_model.", "model.language_model.model."]]}),
}


def is_moe(overrides):
    return "num_experts" in overrides


def make_model(overrides, options, seed):
    torch.manual_seed(seed)
    text = {**TEXT, **overrides}
    top = options.get("top", {})
    if is_moe(overrides):
        cfg = transformers.Qwen3VLMoeConfig(text_config=text, vision_config=VISION, **top)
        cfg.architectures = ["Qwen3VLMoeForConditionalGeneration"]
        model = transformers.Qwen3VLMoeForConditionalGeneration(cfg)
    else:
        cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=VISION, **top)
        cfg.architectures = ["Qwen3VLForConditionalGeneration"]
        model = transformers.Qwen3VLForConditionalGeneration(cfg)
    model.eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            if n.endswith(".bias"):
                p.normal_(0.0, 0.2)
            if "experts" in n or n.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.25)
    return model


def model_class(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        mt = json.load(f)["model_type"]
    return {"qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
            "qwen3_vl_moe": transformers.Qwen3VLMoeForConditionalGeneration,
            # Qwen3.5's vision fixtures (gen_qwen35.py) reuse this module's references.
            "qwen3_5": transformers.Qwen3_5ForConditionalGeneration,
            "qwen3_5_moe": transformers.Qwen3_5MoeForConditionalGeneration}[mt]


def load(model_dir):
    return model_class(model_dir).from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()


def hub_experts(model_dir):
    """Rewrites the fused experts of model_dir in the Hub orientation."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(model_dir, "model.safetensors")
    state = load_file(path)
    n = 0
    for k in list(state):
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            state[k] = state[k].transpose(1, 2).contiguous()
            n += 1
    assert n, "no fused experts"
    save_file(state, path, metadata={"format": "pt"})


@torch.no_grad()
def reference(model, prompts, decode_tokens, prefill_inputs=None):
    """[1 + steps, batch, vocab]: one sequence at a time, text only or with
    prefill_inputs[b] (its images) passed to sequence b's prefill."""
    g = helpers()
    steps = [[] for _ in range(1 + g.DECODE_STEPS)]
    for b, prompt in enumerate(prompts):
        out = model(input_ids=torch.tensor([prompt]), use_cache=True, **(prefill_inputs[b] if prefill_inputs else {}))
        steps[0].append(out.logits[0, -1].numpy())
        past = out.past_key_values
        for s in range(g.DECODE_STEPS):
            out = model(input_ids=torch.tensor([[decode_tokens[b][s]]]), past_key_values=past, use_cache=True)
            steps[s + 1].append(out.logits[0, -1].numpy())
            past = out.past_key_values
    return np.stack([np.stack(s) for s in steps]).astype(np.float32)


@torch.no_grad()
def vision_reference(model_dir, dest, seed):
    """vision.npz: pixel_values, image_grid_thw and what transformers'
    get_image_features returns for them (merged embeddings, DeepStack
    features where the tower has them), from the saved checkpoint."""
    model = load(model_dir)
    v = model.config.vision_config
    grid = torch.tensor(VISION_GRIDS, dtype=torch.int64)
    patches = int((grid[:, 0] * grid[:, 1] * grid[:, 2]).sum())
    width = v.in_channels * v.temporal_patch_size * v.patch_size * v.patch_size
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(patches, width, generator=gen)
    out = model.model.get_image_features(pixel_values=pixels, image_grid_thw=grid, return_dict=True)
    arrays = dict(pixel_values=pixels.numpy(), image_grid_thw=grid.numpy(),
                  vision_embeds=torch.cat(list(out.pooler_output), dim=0).numpy())
    if getattr(out, "deepstack_features", None) is not None:
        arrays["deepstack_features"] = torch.stack([torch.cat(list(f), dim=0) for f in out.deepstack_features]).numpy()
    np.savez_compressed(os.path.join(dest, "vision.npz"), **arrays)


def image_prompts(rng, cfg, high):
    """PROMPT_LAYOUT as token ids: input_ids per sequence and
    mm_token_type_ids (1 at image tokens, as the processor gives them)."""
    merge = cfg.vision_config.spatial_merge_size
    prompts, types = [], []
    for layout in PROMPT_LAYOUT:
        ids = []
        for item in layout:
            if item == "t":
                ids.append(int(rng.integers(3, high)))
                continue
            t, h, w = PROMPT_IMAGES[item]
            ids += [cfg.vision_start_token_id] + [cfg.image_token_id] * (t * (h // merge) * (w // merge)) + [cfg.vision_end_token_id]
        prompts.append(ids)
        types.append([int(i == cfg.image_token_id) for i in ids])
    return prompts, types


@torch.no_grad()
def vision_prompts_reference(model_dir, dest, seed, high):
    """vision_prompts.npz: the PROMPT_LAYOUT batch, its images'
    pixel_values, and transformers' logits with them (prefill, then decode
    steps, one sequence at a time, its own images only), and
    get_rope_index's position_ids [3, batch, seq] and deltas for the
    right-padded batch."""
    g = helpers()
    model = load(model_dir)
    cfg = model.config
    rng = np.random.default_rng(seed + 1)
    prompts, types = image_prompts(rng, cfg, high)
    decode_tokens = [rng.integers(3, high, size=g.DECODE_STEPS).tolist() for _ in prompts]
    width = cfg.vision_config.in_channels * cfg.vision_config.temporal_patch_size * cfg.vision_config.patch_size ** 2
    gen = torch.Generator().manual_seed(seed + 1)
    pixels = [torch.randn(int(np.prod(grid)), width, generator=gen) for grid in PROMPT_IMAGES]
    owner = [item for layout in PROMPT_LAYOUT for item in layout if item != "t"]  # image order, row-major
    images = []
    for b, layout in enumerate(PROMPT_LAYOUT):
        mine = [k for k in owner if k in layout]
        images.append(dict(mm_token_type_ids=torch.tensor([types[b]]), pixel_values=torch.cat([pixels[k] for k in mine]),
                           image_grid_thw=torch.tensor([PROMPT_IMAGES[k] for k in mine])))
    logits = reference(model, prompts, decode_tokens, images)
    ids = g.pad(prompts)
    lengths = np.array([len(p) for p in prompts], dtype=np.int64)
    mask = torch.tensor(np.arange(ids.shape[1])[None, :] < lengths[:, None], dtype=torch.int64)
    rope, deltas = model.model.get_rope_index(torch.tensor(ids), mm_token_type_ids=torch.tensor(g.pad(types)),
                                              image_grid_thw=torch.tensor([PROMPT_IMAGES[k] for k in owner]),
                                              attention_mask=mask)
    np.savez_compressed(os.path.join(dest, "vision_prompts.npz"), prompts=ids, prompt_lengths=lengths,
                        decode_tokens=np.array(decode_tokens, dtype=np.int64),
                        pixel_values=torch.cat([pixels[k] for k in owner]).numpy(),
                        image_grid_thw=np.array([PROMPT_IMAGES[k] for k in owner], dtype=np.int64),
                        logits=logits,
                        rope_position_ids=rope.numpy(), rope_deltas=deltas.numpy().reshape(-1))


def generate_fixture(dest, name, overrides, dtype, options, make=None):
    """make(): the model (default: make_model's Qwen3-VL)."""
    g = helpers()
    seed = options["seed"]
    rng = np.random.default_rng(seed)
    vocab = min([TEXT["vocab_size"]] + [v for k, v in options.get("top", {}).items() if k.endswith("token_id")])
    prompts = [rng.integers(3, vocab, size=n).tolist() for n in g.PROMPT_LENGTHS]
    decode_tokens = [rng.integers(3, vocab, size=g.DECODE_STEPS).tolist() for _ in g.PROMPT_LENGTHS]
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    model_dir = os.path.join(dest, "model")
    model = (make() if make else make_model(overrides, options, seed)).to(getattr(torch, dtype))
    model.save_pretrained(model_dir, safe_serialization=True)
    logits = reference(load(model_dir), prompts, decode_tokens)
    if options.get("hub_experts"):
        hub_experts(model_dir)
        hub = reference(load(model_dir), prompts, decode_tokens)
        assert np.array_equal(hub, logits), "transformers reads the Hub orientation back differently"
    if options.get("rekey"):
        g.rekey(model_dir, options["rekey"], load)
        rekeyed = reference(load(model_dir), prompts, decode_tokens)
        assert np.array_equal(rekeyed, logits), "transformers reads the other key layout back differently"
    vision_reference(model_dir, dest, seed)
    if options.get("vision_prompts"):
        vision_prompts_reference(model_dir, dest, seed, vocab)
    arrays = dict(logits=logits, prompt_lengths=np.array(g.PROMPT_LENGTHS, dtype=np.int64),
                  prompts=g.pad(prompts), decode_tokens=np.array(decode_tokens, dtype=np.int64))
    meta = dict(name=name, checkpoint_dtype=dtype, ctx_len=g.CTX_LEN, decode_steps=g.DECODE_STEPS,
                config_overrides=overrides, options=options, seed=seed,
                transformers=transformers.__version__, torch=torch.__version__)
    np.savez_compressed(os.path.join(dest, "reference.npz"), **arrays)
    with open(os.path.join(dest, "fixture.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: {dtype}, {sum(os.path.getsize(os.path.join(model_dir, x)) for x in os.listdir(model_dir))} bytes")


def generate(names):
    for name in sorted(QWEN3VL_SPEC):
        if name in names:
            overrides, dtype, options = QWEN3VL_SPEC[name]
            generate_fixture(os.path.join(helpers().FIXTURES, name), name, overrides, dtype, options)
