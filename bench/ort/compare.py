#!/usr/bin/env python3
"""Side-by-side: strata's exports against the ONNX Runtime GenAI model
builder's, as ONNX Runtime users meet them (issues 17 and 29).

For a random LlamaForCausalLM saved in float32 and in bfloat16, it measures
strata's default export (layer bodies inlined), --subfunctions, --target ort
(builder-style IO for onnxruntime-genai; "not available" while strata does not
know the flag), the builder's, and for bfloat16 --subfunctions --weights
materialize and --target ort --weights materialize. For each:
- the export: wall, CPU, peak RSS, bytes written;
- session creation: onnxruntime.InferenceSession with default options in a
  fresh process per run, wall and peak RSS;
- serving (serve.py, a process of its own): prefill wall at each --prompts
  length and decode ms/token after it (median of --steps steps), greedy
  tokens checked against transformers';
- onnxruntime-genai tokens/s, where the export has a genai_config.json;
- one prefill's last-token logits against transformers'.
Every measured process runs under GNU time (the torch bench's run_measured),
so this process's memory never enters a figure. report.py writes the tables.

The same file is the child for the steps that need torch:
`compare.py _child build|reference ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "bench" / "torch"))
import compare as torchbench  # noqa: E402  (run_measured, build_checkpoint; bench/torch's compare.py)
import report  # noqa: E402  (bench/ort, the script's own directory, after bench/torch)
import serve  # noqa: E402

PROMPT = [1, 306, 4658, 278, 6593, 310, 2834, 338, 29871, 29946, 29906, 29889]
LOAD = "import sys, onnxruntime as o; o.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])"
tools_for = report.tools_for  # the exports compared, in table order


def parse_args(argv):
    p = argparse.ArgumentParser(description="strata export against the ONNX Runtime GenAI builder, run by ONNX Runtime")
    # A 178M Llama by default, the size of the figures: serving an
    # 853M one (the default before issue 29) at 1,024 tokens, five exports,
    # two dtypes and three runs would take over half an hour on 2 cores.
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--runs", type=int, default=3, help="runs per measurement (medians)")
    p.add_argument("--prompts", default="128,1024", help="prompt lengths prefilled, each followed by --steps decode steps")
    p.add_argument("--steps", type=int, default=32, help="decode steps after each prompt (median ms/token)")
    p.add_argument("--threads", type=int, default=2, help="intra_op_num_threads of the serving sessions")
    p.add_argument("--strata", type=Path, default=REPO / "bin" / "strata")
    p.add_argument("--work", type=Path)
    p.add_argument("--json", type=Path, default=HERE / "results.json")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--ort-stand-in", action="store_true",
                   help="test only: the builder's output stands in for strata --target ort (same IO family), "
                        "to test that column's driver and onnxruntime-genai run before strata has the flag")
    p.add_argument("--table", type=Path, help="print the tables of a results.json written before, and run nothing")
    args = p.parse_args(argv)
    args.prompt_lengths = [int(x) for x in args.prompts.split(",") if x.strip()]
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if not args.prompt_lengths or min(args.prompt_lengths) < 8 or args.steps < 1:
        p.error("--prompts: lengths of at least 8 tokens; --steps at least 1")
    return args


# ------------------------------------------------------------------ children


def child(argv):
    step, rest = argv[0], argv[1:]
    if step == "build":
        model_dir, spec = Path(rest[0]), json.loads(rest[1])
        rep = {"phases_s": {}}
        torchbench.build_checkpoint(model_dir, spec, rep)
        write_tokenizer(model_dir, spec["vocab"])
        print(json.dumps(rep))
    elif step == "reference":
        print(json.dumps(reference(Path(rest[0]), json.loads(Path(rest[1]).read_text()))))
    return 0


def write_tokenizer(model_dir: Path, vocab: int) -> None:
    """A word-level tokenizer of the vocabulary's size: the builder saves the
    checkpoint's tokenizer beside its model, so it needs one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2").save_pretrained(model_dir)


def reference(model_dir: Path, spec: dict) -> dict:
    """transformers' greedy tokens after each serving prompt (steps + 1 of
    them: the prefill's and each decode step's), and each export's
    last-token logits for PROMPT against transformers' (spec["models"]: a
    TOOLS key to its model.onnx and the serving driver's options)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = np.array([[t % model.config.vocab_size for t in PROMPT]], np.int64)
    out = {"greedy": {}}
    with torch.no_grad():
        ref = model(torch.from_numpy(ids)).logits[0, -1].numpy()
        for prompt in spec["prompts"]:
            step = model(torch.tensor([prompt]), use_cache=True)
            tokens = [int(step.logits[0, -1].argmax())]
            for _ in range(spec["steps"]):
                step = model(torch.tensor([[tokens[-1]]]), past_key_values=step.past_key_values, use_cache=True)
                tokens.append(int(step.logits[0, -1].argmax()))
            out["greedy"][str(len(prompt))] = tokens
    del model
    out["scale"] = float(np.abs(ref).max())
    for key, m in spec["models"].items():
        drv = serve.Driver(serve.session(m["path"], spec["threads"]), m["head_dim"], m["shared_buffer"])
        drv.reset(ids.shape[1])
        out[key + "_max_abs_diff"] = float(np.abs(drv.step(ids) - ref).max())
    return out


# -------------------------------------------------------------------- parent


def measured(cmd, work: Path, label: str, timeout: float) -> dict:
    return torchbench.run_measured([str(c) for c in cmd], timeout, work / f"{label}.log")


def dir_bytes(path: Path) -> int:
    """Bytes an export wrote: its own files, not the checkpoint shards strata
    reaches through checkpoint/ (hard links or clones of the source)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and "checkpoint" not in f.relative_to(path).parts[:1])


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def first_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip() and not ln.startswith("Command exited")]
    return lines[0].strip() if lines else "(no output)"


def genai_config(out: Path) -> dict | None:
    path = out / "genai_config.json"
    return json.loads(path.read_text()) if path.exists() else None


def model_file(out: Path) -> Path:
    """The decoder genai_config.json names, else model.onnx."""
    cfg = genai_config(out)
    return out / (cfg["model"]["decoder"].get("filename", "model.onnx") if cfg else "model.onnx")


def export_cmd(args, tool: str, flags, ckpt: Path, out: Path, work: Path) -> list:
    if flags is not None:
        return [args.strata, "-q", "export", ckpt, "--out", out, *flags]
    return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", ckpt, "-o", out, "-p", "fp32", "-e", "cpu",
            "-c", work / "hf-cache"]


def export_all(args, dtype: str, ckpt: Path, work: Path, row: dict) -> dict:
    """Runs each export --runs times; returns the exports that exist (tool ->
    dir). An export strata does not offer (--target ort before it lands) is
    a row saying so, not a failure of the run."""
    outs = {tool: work / f"{tool}-{dtype}" for tool, _, _, _ in tools_for(dtype)}
    flags = {tool: f for tool, _, f, _ in tools_for(dtype)}
    exports = {tool: [] for tool in outs}
    for i in range(args.runs):
        for tool, out in outs.items():
            if tool in row:  # not available: said once
                continue
            if tool == "strata_ort" and args.ort_stand_in:
                continue
            subprocess.run(["rm", "-rf", str(out)], check=True)
            label = f"export-{tool}-{dtype}-{i}"
            m = measured(export_cmd(args, tool, flags[tool], ckpt, out, work), work, label, args.timeout)
            if m.get("exit_code", 0) != 0:
                if tool.startswith("strata_ort"):
                    row[tool] = {"unavailable": "not available: " + first_line(work / f"{label}.log")}
                    continue
                raise SystemExit(f"{tool} export of the {dtype} checkpoint failed: see {work}/{label}.log")
            m["written"] = dir_bytes(out)
            exports[tool].append(m)
    if args.ort_stand_in and "strata_ort" in outs:
        subprocess.run(["rm", "-rf", str(outs["strata_ort"])], check=True)
        shutil.copytree(outs["builder"], outs["strata_ort"])
        exports["strata_ort"] = exports["builder"]
        row["ort_stand_in"] = True
    for tool, runs in exports.items():
        if runs:
            row[tool] = {
                "export_wall_s": median_of(runs, "wall_s"), "export_cpu_s": median_of(runs, "cpu_s"),
                "export_peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs), "written_bytes": runs[-1]["written"],
            }
    return {tool: out for tool, out in outs.items() if exports[tool]}


def serve_spec(args, prompts: list[list[int]], out: Path) -> dict:
    cfg = genai_config(out)
    return {"prompts": prompts, "steps": args.steps, "runs": 1, "threads": args.threads,
            "head_dim": args.hidden // args.heads,
            "shared_buffer": bool(cfg and cfg.get("search", {}).get("past_present_share_buffer", False))}


def run_serve(args, kind: str, target: Path, spec: dict, work: Path, label: str) -> dict:
    spec_path, rep_path = work / f"{label}.spec.json", work / f"{label}.report.json"
    spec_path.write_text(json.dumps(spec))
    m = measured([sys.executable, HERE / "serve.py", kind, target, spec_path, rep_path], work, label, args.timeout)
    if m.get("exit_code", 0) != 0 or not rep_path.exists():
        return {"error": f"{kind} run failed (exit {m.get('exit_code')}): " + torchbench.tail(work / f"{label}.log", 3).strip()}
    return {**json.loads(rep_path.read_text()), "peak_rss_bytes": m["peak_rss_bytes"]}


def serve_all(args, dtype: str, outs: dict, prompts: list[list[int]], work: Path, row: dict) -> None:
    """Serving and onnxruntime-genai, one process per export and run, the
    exports in turn within each run: on a shared machine a busy minute then
    slows one run of every export, not every run of one."""
    got = {tool: {"serve": [], "genai": []} for tool in outs}
    for i in range(args.runs):
        for tool, out in outs.items():
            got[tool]["serve"].append(run_serve(args, "ort", model_file(out), serve_spec(args, prompts, out), work, f"serve-{tool}-{dtype}-{i}"))
            if genai_config(out) is not None:
                gspec = {"prompt": prompts[0], "new_tokens": args.steps + 1, "runs": 1, "threads": args.threads}
                got[tool]["genai"].append(run_serve(args, "genai", out, gspec, work, f"genai-{tool}-{dtype}-{i}"))
    for tool, out in outs.items():
        reps = got[tool]["serve"]
        failed = next((r for r in reps if "error" in r), None)
        row[tool]["serve"] = failed or {**serve.summarize_ort(reps), "peak_rss_bytes": max(r["peak_rss_bytes"] for r in reps)}
        reps = got[tool]["genai"]
        failed = next((r for r in reps if "error" in r), None)
        row[tool]["genai"] = (failed or serve.summarize_genai(reps) if reps else
                              {"unavailable": "no genai_config.json (not an onnxruntime-genai model)"})


def prompts_for(args) -> list[list[int]]:
    """Fixed pseudo-random prompts, one per length; ids from 3 (past the
    tokenizer's unk/bos/eos)."""
    import random

    rng = random.Random(0)
    return [[rng.randrange(3, args.vocab) for _ in range(n)] for n in args.prompt_lengths]


def one_dtype(args, dtype: str, work: Path) -> dict:
    ckpt = work / f"ckpt-{dtype}"
    spec = {"layers": args.layers, "hidden": args.hidden, "intermediate": args.intermediate, "heads": args.heads,
            "kv_heads": args.kv_heads, "vocab": args.vocab, "dtype": dtype, "seed": 0}
    built = subprocess.run([sys.executable, __file__, "_child", "build", str(ckpt), json.dumps(spec)], capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(f"building the {dtype} checkpoint failed:\n{built.stderr[-3000:]}")
    params = json.loads(built.stdout.strip().splitlines()[-1])["parameters"]
    row = {"dtype": dtype, "parameters": params, "checkpoint_bytes": sum(f.stat().st_size for f in ckpt.iterdir() if f.is_file())}
    outs = export_all(args, dtype, ckpt, work, row)
    sessions = {tool: [] for tool in outs}
    for i in range(args.runs):
        for tool, out in outs.items():
            sessions[tool].append(measured([sys.executable, "-c", LOAD, model_file(out)], work, f"load-{tool}-{dtype}-{i}", args.timeout))
    prompts = prompts_for(args)
    for tool in outs:
        row[tool]["session_s"] = median_of(sessions[tool], "wall_s")
        row[tool]["session_peak_rss_bytes"] = statistics.median(r["peak_rss_bytes"] for r in sessions[tool])
    row["load_average_before_serving"] = os.getloadavg()
    serve_all(args, dtype, outs, prompts, work, row)
    row["load_average_after_serving"] = os.getloadavg()
    models = {tool: {"path": str(model_file(out)), **{k: v for k, v in serve_spec(args, [], out).items() if k in ("head_dim", "shared_buffer")}}
              for tool, out in outs.items()}
    ref_spec = work / f"reference-{dtype}.json"
    ref_spec.write_text(json.dumps({"prompts": prompts, "steps": args.steps, "threads": args.threads, "models": models}))
    got = subprocess.run([sys.executable, __file__, "_child", "reference", str(ckpt), str(ref_spec)], capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"the transformers reference failed:\n{got.stderr[-3000:]}")
    row["reference"] = json.loads(got.stdout.strip().splitlines()[-1])
    report.check_tokens(row, prompts)
    return row


def main(argv):
    if argv and argv[0] == "_child":
        return child(argv[1:])
    args = parse_args(argv)
    if args.table:
        print(report.tables(json.loads(args.table.read_text())))
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="strata-bench-ort-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = [one_dtype(args, d.strip(), work) for d in args.dtypes.split(",") if d.strip()]
    res = {"machine": torchbench.machine_facts(), "runs": args.runs, "prompts": args.prompt_lengths, "steps": args.steps,
           "threads": args.threads, "ort_stand_in": args.ort_stand_in,
           "model": {k: getattr(args, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")}, "rows": rows}
    # Token lists on one line each: a list of ints per line would make the file thousands of lines.
    args.json.write_text(re.sub(r"\[\s+(-?\d[\d,\s.e+-]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]",
                                json.dumps(res, indent=2)) + "\n")
    print(report.tables(res))
    if args.work is None:
        subprocess.run(["rm", "-rf", str(work)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
