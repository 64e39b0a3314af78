"""strata convert's quantised outputs round-trip: `strata convert --quantize
fp8-block|fp8-dynamic`, then `strata export` of the result under ONNX
Runtime, reproduces transformers loading the converted checkpoint (its
FineGrainedFP8 loader, or compressed-tensors with FP8_DYNAMIC's per-token
activation quantisation) within 1e-4 of the logit scale, prefill and
decode, whole, layerwise and materialised.

Needs bin/strata and its plugins, and requirements-client.txt (torch,
transformers, compressed-tensors, accelerate, onnxruntime). Nothing is
skipped.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import accelerate  # noqa: F401  the FP8 loader needs it
import compressed_tensors  # noqa: F401  the fp8-dynamic loader needs it

HERE = os.path.dirname(os.path.abspath(__file__))
CONFORMANCE = os.path.dirname(HERE)
sys.path.insert(0, CONFORMANCE)
import ortrun  # noqa: E402

ROOT = os.path.dirname(CONFORMANCE)
FIXTURES = os.path.join(CONFORMANCE, "fixtures")
STRATA = os.environ.get("STRATA", os.path.join(ROOT, "bin", "strata"))


def run(*args):
    if not os.access(STRATA, os.X_OK):
        pytest.fail(f"{STRATA} is missing: build it first (make build)")
    proc = subprocess.run([STRATA, *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"strata {args[0]} failed:\n{proc.stderr}"


@torch.no_grad()
def transformers_logits(model_dir, ref):
    """generate.py's reference loop: each prompt alone, prefill then one
    token per step with the cache, in float32."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager").eval()
    steps = [[] for _ in range(1 + ref["decode_tokens"].shape[1])]
    for b, n in enumerate(ref["prompt_lengths"]):
        out = model(input_ids=torch.tensor([ref["prompts"][b][:n].tolist()]), use_cache=True)
        steps[0].append(out.logits[0, -1].numpy())
        past = out.past_key_values
        for s, token in enumerate(ref["decode_tokens"][b]):
            out = model(input_ids=torch.tensor([[int(token)]]), past_key_values=past, use_cache=True)
            steps[s + 1].append(out.logits[0, -1].numpy())
            past = out.past_key_values
    return np.stack([np.stack(s) for s in steps]).astype(np.float32)


CASES = [("llama-f32-base", "fp8-block"), ("llama-bf16-sharded", "fp8-block"), ("qwen3moe-f32-top2-norm", "fp8-block"),
         ("llama-f32-base", "fp8-dynamic"), ("llama-f32-tied-gqa4", "fp8-dynamic"), ("qwen3moe-f32-top2-norm", "fp8-dynamic"),
         # linear attention with its fused in-projections sliced from FP8 blocks (Qwen3-Next ships FP8 so)
         ("qwen3next-f32", "fp8-block"), ("qwen35-f32-dense", "fp8-dynamic")]


@pytest.mark.parametrize("name,scheme", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_converted_checkpoint_exports_as_transformers_loads_it(tmp_path, name, scheme):
    fixture = os.path.join(FIXTURES, name)
    ref = np.load(os.path.join(fixture, "reference.npz"))
    with open(os.path.join(fixture, "fixture.json")) as f:
        ctx_len = json.load(f)["ctx_len"]
    converted = tmp_path / "converted"
    run("convert", os.path.join(fixture, "model"), "--out", str(converted), "--quantize", scheme, "-q")
    want = transformers_logits(converted, ref)
    scale = np.abs(want).max()
    for label, args in [("whole", []), ("layerwise", ["--layerwise", "--window-size", "1"]),
                        ("materialised", ["--weights", "materialize"])]:
        out = tmp_path / label
        run("export", str(converted), "--out", str(out), "-q", *args)
        got = ortrun.run(ortrun.session(str(out / "model.onnx")), ref["prompts"], ref["prompt_lengths"],
                         ref["decode_tokens"], ctx_len)
        diff = np.abs(got - want).max()
        source = np.abs(got - ref["logits"]).max()
        print(f"{name} {scheme} {label}: max |Δlogits| {diff:.2e} vs transformers on the converted checkpoint "
              f"(scale {scale:.2f}); {source:.2e} vs the unquantised source")
        assert diff <= 1e-4 * scale, f"{label}: {diff:.2e} at logit scale {scale:.2f}"
        assert source > 1e-3, "the quantised export computes the unquantised model: the scales are not applied"
