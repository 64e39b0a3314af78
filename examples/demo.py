#!/usr/bin/env python3
"""The demo: export the tiny Llama that ships in examples/tiny-llama with
strata, then greedy-decode with ONNX Runtime and compare with the tokens
Hugging Face transformers generated for the same prompts. Run: make demo"""

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "conformance"))
import ortrun  # noqa: E402

MODEL = os.path.join(ROOT, "examples", "tiny-llama")
OUT = os.path.join(ROOT, "out", "tiny-llama")
STRATA = os.path.join(ROOT, "bin", "strata")


def main():
    print(f"$ strata export {os.path.relpath(MODEL)}/model --out {os.path.relpath(OUT)}")
    subprocess.run([STRATA, "export", os.path.join(MODEL, "model"), "--out", OUT], check=True)

    ref = np.load(os.path.join(MODEL, "reference.npz"))
    with open(os.path.join(MODEL, "fixture.json")) as f:
        meta = json.load(f)
    sess = ortrun.session(os.path.join(OUT, "model.onnx"))
    tokens = ortrun.greedy(sess, ref["prompts"], ref["prompt_lengths"], meta["greedy_tokens"], meta["ctx_len"])

    print("\ngreedy decoding under ONNX Runtime (batch of 2, different prompt lengths, KV cache fed back):")
    for b, n in enumerate(ref["prompt_lengths"]):
        print(f"  prompt {ref['prompts'][b][:n].tolist()}")
        print(f"    strata + ONNX Runtime: {tokens[b].tolist()}")
        print(f"    transformers generate: {ref['greedy'][b].tolist()}")
    same = np.array_equal(tokens, ref["greedy"])
    print(f"\n{'identical' if same else 'DIFFERENT'} to transformers' greedy tokens")
    print(f"files: {OUT}/model.onnx, {OUT}/weight_spec.json, {OUT}/checkpoint/ (hard links to the checkpoint)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
