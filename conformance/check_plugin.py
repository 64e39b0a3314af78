#!/usr/bin/env python3
"""Checks an architecture plugin built anywhere (in or out of this
repository) against Hugging Face transformers: strata exports a checkpoint
with the plugin found in --plugin-dir, ONNX Runtime runs the export the way
the conformance suite does (ortrun.py: a padded batch of two prompts, then
decode steps feeding each step's retained KV cache back), and the logits
must match the ones transformers computed for the same checkpoint.

Two steps, each in its own environment:

  reference  needs torch and transformers (requirements-gen.txt): random
             prompts and decode tokens from the checkpoint's vocabulary,
             and transformers' logits for them in float32, written as one
             .npz (generate.py's reference()).
  check      needs onnxruntime and numpy (requirements-test.txt) and a
             built bin/strata: no torch, no transformers.

  python check_plugin.py reference CHECKPOINT --out reference.npz
  python check_plugin.py check CHECKPOINT --reference reference.npz --plugin-dir DIR

The checkpoint may be any transformers can load and the plugin can export;
keep it tiny (conformance/generate.py's sizes), it is run in float32 on CPU.
A fixture directory of the suite (model/, reference.npz) works as is:
check FIXTURE/model --reference FIXTURE/reference.npz.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
STRATA = os.environ.get("STRATA", os.path.join(os.path.dirname(HERE), "bin", "strata"))
PROMPT_LENGTHS = [7, 4]  # generate.py's: padding and per-row positions
DECODE_STEPS = 4  # generate.py's (its reference() runs that many)
CTX_LEN = 32
TOLERANCE = 1e-4  # test_conformance.py's: float32 both sides, only summation order differs


def text_config(checkpoint):
    with open(os.path.join(checkpoint, "config.json")) as f:
        cfg = json.load(f)
    return cfg.get("text_config", cfg)


def make_reference(args):
    import generate  # torch and transformers; imported here so `check` needs neither

    vocab = text_config(args.checkpoint)["vocab_size"]
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(3, vocab, size=n).tolist() for n in PROMPT_LENGTHS]
    decode = [rng.integers(3, vocab, size=DECODE_STEPS).tolist() for _ in PROMPT_LENGTHS]
    logits = generate.reference(args.checkpoint, prompts, decode)
    np.savez_compressed(args.out, logits=logits, prompts=generate.pad(prompts),
                        prompt_lengths=np.array(PROMPT_LENGTHS, dtype=np.int64),
                        decode_tokens=np.array(decode, dtype=np.int64), ctx_len=np.int64(CTX_LEN),
                        transformers=np.str_(generate.transformers.__version__))
    print(f"{args.out}: transformers {generate.transformers.__version__} logits {list(logits.shape)} "
          "[prefill + decode steps, batch, vocab]")


def strata(*args):
    proc = subprocess.run([STRATA, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"strata {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def check(args):
    import ortrun  # onnxruntime

    if not os.access(STRATA, os.X_OK):
        sys.exit(f"{STRATA} is missing: build strata first (make build), or set STRATA")
    ref = np.load(args.reference)
    ctx_len = int(ref["ctx_len"]) if "ctx_len" in ref else CTX_LEN
    plugin = check_plugin_dir(args.checkpoint, args.plugin_dir)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"whole": ["--out", os.path.join(tmp, "whole")]}
        if args.layerwise:
            runs["layerwise"] = ["--out", os.path.join(tmp, "layerwise"), "--layerwise", "--window-size", "1"]
        worst = 0.0
        for label, flags in runs.items():
            strata("export", args.checkpoint, "--plugin-dir", args.plugin_dir, "--quiet", *flags)
            sess = ortrun.session(os.path.join(flags[1], "model.onnx"))
            got = ortrun.run(sess, ref["prompts"], ref["prompt_lengths"], ref["decode_tokens"], ctx_len)
            if got.shape != ref["logits"].shape:
                sys.exit(f"{label}: logits of shape {got.shape}, the reference's are {ref['logits'].shape}")
            diffs = np.abs(got - ref["logits"]).max(axis=(1, 2))
            worst = max(worst, float(diffs.max()))
            steps = ", ".join(f"{'prefill' if i == 0 else f'decode {i}'} {d:.2e}" for i, d in enumerate(diffs))
            print(f"{plugin}, {label}: max |Δlogits| {steps}")
    if worst > args.tolerance:
        sys.exit(f"FAIL: logits differ from transformers by {worst:.2e} (tolerance {args.tolerance:.0e})")
    print(f"OK: max |Δlogits| {worst:.2e} <= {args.tolerance:.0e}")


def check_plugin_dir(checkpoint, plugin_dir):
    """The plugin strata picks for the checkpoint's model_type, which must be
    one found in plugin_dir (not one installed elsewhere that claims it too)."""
    with open(os.path.join(checkpoint, "config.json")) as f:
        model_type = json.load(f)["model_type"]
    found = json.loads(strata("archs", "--json", "--plugin-dir", plugin_dir))["plugins"]
    winners = [p for p in found for a in p.get("architectures") or []
               if a["model_type"] == model_type and not a.get("shadowed_by")]
    if not winners:
        sys.exit(f"no plugin handles model_type {model_type!r}; found: " +
                 ", ".join(f"{p['name']} ({p['path']}{': ' + p['error'] if p.get('error') else ''})" for p in found))
    winner = winners[0]
    if os.path.dirname(os.path.realpath(winner["path"])) != os.path.realpath(plugin_dir):
        sys.exit(f"model_type {model_type!r} is handled by {winner['path']} ({winner['found_via']}), not a plugin of {plugin_dir}")
    return f"{winner['name']} {winner['version']} ({winner['path']})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("reference", help="transformers' logits for a checkpoint (needs torch, transformers)")
    r.add_argument("checkpoint", help="a Hugging Face checkpoint directory")
    r.add_argument("--out", required=True, help="the .npz to write")
    r.add_argument("--seed", type=int, default=0, help="of the random prompts and decode tokens")
    c = sub.add_parser("check", help="export with the plugin, run with ONNX Runtime, compare (needs onnxruntime)")
    c.add_argument("checkpoint", help="the checkpoint the reference was made from")
    c.add_argument("--reference", required=True, help="the .npz `reference` wrote")
    c.add_argument("--plugin-dir", required=True, help="the directory holding strata-plugin-<name>")
    c.add_argument("--layerwise", action="store_true", help="also export layer by layer (one layer a window)")
    c.add_argument("--tolerance", type=float, default=TOLERANCE, help="max |Δlogits| (default %(default)g)")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    (make_reference if args.command == "reference" else check)(args)


if __name__ == "__main__":
    main()
