#!/usr/bin/env python3
"""Makes testdata/tiny-qwen2: a tiny random Qwen2ForCausalLM saved by
transformers (bfloat16, conformance/generate.py's sizes; 2 layers, layer 1
sliding with a window of 4, shorter than the longer prompt; q/k/v biases
and norms randomised so a missing one shows; tied embeddings), and
transformers' logits for it (conformance/check_plugin.py reference).

Needs torch and transformers (conformance/requirements-gen.txt). Run from
anywhere: python examples/plugin-outoftree/testdata/generate.py
"""

import os
import shutil
import subprocess
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
OUT = os.path.join(HERE, "tiny-qwen2")

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
              use_sliding_window=True, sliding_window=4, max_window_layers=1,
              rope_parameters=dict(rope_type="default", rope_theta=1000000.0), bos_token_id=1, eos_token_id=2)


def main():
    torch.manual_seed(25)
    cfg = Qwen2Config(**CONFIG)
    cfg.architectures = ["Qwen2ForCausalLM"]
    assert cfg.layer_types == ["full_attention", "sliding_attention"], cfg.layer_types
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.2)
            else:
                p.normal_(0.0, 0.25)
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    model.to(torch.bfloat16).save_pretrained(os.path.join(OUT, "model"), safe_serialization=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "conformance", "check_plugin.py"), "reference",
                    os.path.join(OUT, "model"), "--out", os.path.join(OUT, "reference.npz"), "--seed", "25"], check=True)


if __name__ == "__main__":
    main()
