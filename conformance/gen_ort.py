"""Greedy references for the --target ort tests (test_ort_target.py),
registered in generate.py.

For each fixture whose architecture maps onto ONNX Runtime's form,
greedy.npz holds transformers' greedy generation (GREEDY_TOKENS new tokens
per prompt of reference.npz, no end token): what strata's --target ort
export, run by ONNX Runtime and by onnxruntime-genai, must generate. It is
written beside the fixture's reference.npz whenever the fixture is
regenerated, or alone: `python gen_ort.py [names]`.
"""

import os
import sys

import numpy as np

GREEDY_TOKENS = 16

# Dense fixtures of every architecture --target ort maps: both GQA rotary
# paths (head_dim 16 inside GroupQueryAttention, 24 and 8 outside), bf16
# and float32 checkpoints, q/k norms, a sliding window, partial longrope,
# Qwen3-MoE's and GLM-4.x MoE's experts.
ORT_GREEDY = ["llama-f32-base", "llama-bf16-gqa2", "llama-f32-llama3-headdim", "qwen3-bf16-gqa4",
              "qwen3-f32-bias-tied", "mistral-f32-sliding", "olmo2-f32-gqa", "phi3-f32-longrope",
              "qwen3moe-f32-top2-norm", "qwen3moe-bf16-top4-sparse", "glm-f32-qknorm-groups", "glm-bf16-dense2-shared2"]


def generate_extras(fixtures, names):
    import generate

    for name in ORT_GREEDY:
        if name not in names:
            continue
        d = os.path.join(fixtures, name)
        ref = np.load(os.path.join(d, "reference.npz"))
        prompts = [row[:n].tolist() for row, n in zip(ref["prompts"], ref["prompt_lengths"])]
        tokens = generate.greedy(os.path.join(d, "model"), prompts, GREEDY_TOKENS)
        np.savez_compressed(os.path.join(d, "greedy.npz"), greedy=np.array(tokens, dtype=np.int64))
        print(f"{name}: greedy.npz ({GREEDY_TOKENS} tokens)")


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    generate_extras(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"), sys.argv[1:] or ORT_GREEDY)
