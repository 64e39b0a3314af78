#!/usr/bin/env python3
"""Side-by-side: strata's export against the ONNX Runtime GenAI model builder's,
as ONNX Runtime users meet them (issue 17).

For a random LlamaForCausalLM saved in float32 and in bfloat16, it measures
three exports: strata's default (layer bodies inlined), strata's with
--subfunctions (each decoder layer a local function) and the builder's. For
each: the export (wall, CPU, peak RSS, bytes written), the
onnxruntime.InferenceSession creation (default options, a fresh process per
run: wall and peak RSS), and one prefill's last-token logits against
transformers'. Every measured process runs under GNU time (the
torch bench's run_measured), so this process's memory never enters a figure.

The same file is the child for the steps that need torch:
`compare.py _child build|logits ...`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "bench" / "torch"))
import compare as torchbench  # noqa: E402  (run_measured, build_checkpoint)

PROMPT = [1, 306, 4658, 278, 6593, 310, 2834, 338, 29871, 29946, 29906, 29889]
LOAD = "import sys, onnxruntime as o; o.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])"
# The exports compared, in table order: key, label, strata's export flags
# (None: the builder), and the checkpoint dtypes it is measured on (None: all).
# Materialising weights only changes a half-precision checkpoint's export: it
# writes the float32 weights ONNX Runtime would otherwise fold at every load.
TOOLS = (("strata", "strata export", [], None),
         ("strata_subfunctions", "strata export --subfunctions", ["--subfunctions"], None),
         ("strata_materialized", "strata export --subfunctions --weights materialize",
          ["--subfunctions", "--weights", "materialize"], {"bfloat16"}),
         ("builder", "ONNX Runtime GenAI builder", None, None))


def tools_for(dtype: str):
    return [t for t in TOOLS if t[3] is None or dtype in t[3]]


def parse_args(argv):
    p = argparse.ArgumentParser(description="strata export against the ONNX Runtime GenAI builder, loaded by ONNX Runtime")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--runs", type=int, default=3, help="runs per measurement (medians)")
    p.add_argument("--strata", type=Path, default=REPO / "bin" / "strata")
    p.add_argument("--work", type=Path)
    p.add_argument("--json", type=Path, default=HERE / "results.json")
    p.add_argument("--timeout", type=float, default=3600.0)
    return p.parse_args(argv)


# ------------------------------------------------------------------ children


def child(argv):
    step, rest = argv[0], argv[1:]
    if step == "build":
        model_dir, spec = Path(rest[0]), json.loads(rest[1])
        report = {"phases_s": {}}
        torchbench.build_checkpoint(model_dir, spec, report)
        write_tokenizer(model_dir, spec["vocab"])
        print(json.dumps(report))
    elif step == "logits":
        print(json.dumps(logits_report(Path(rest[0]), json.loads(rest[1]))))
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


def logits_report(model_dir: Path, models: dict) -> dict:
    """Each export's last-token logits against transformers': models maps a
    TOOLS key to its model.onnx."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = np.array([[t % model.config.vocab_size for t in PROMPT]], np.int64)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        ref = model(torch.from_numpy(ids)).logits[0, -1].numpy()
    del model

    def run(path: Path, feeds_for):
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        out = sess.run(["logits"], feeds_for(sess))[0]
        return out.reshape(-1, out.shape[-1])[-1], names

    def strata_feeds(sess):
        feeds = {}
        for i in sess.get_inputs():
            if i.name == "input_ids":
                feeds[i.name] = ids
            elif i.name == "position_ids":
                feeds[i.name] = np.arange(ids.shape[1], dtype=np.int64)[None]
            else:  # the KV cache, empty: ctx_len 64 rows, none written yet
                feeds[i.name] = np.zeros([1 if d == "batch_size" else 64 if isinstance(d, str) else d for d in i.shape], np.float32)
        return feeds

    def builder_feeds(sess):
        feeds = {}
        for i in sess.get_inputs():
            if i.name == "input_ids":
                feeds[i.name] = ids
            elif i.name == "attention_mask":
                feeds[i.name] = np.ones_like(ids)
            elif i.name == "position_ids":
                feeds[i.name] = np.arange(ids.shape[1], dtype=np.int64)[None]
            else:  # past_key_values.N.key/value [batch, kv_heads, past, head_dim]: no past
                feeds[i.name] = np.zeros([1, i.shape[1], 0, head_dim], np.float32)
        return feeds

    report = {"scale": float(np.abs(ref).max())}
    for key, path in models.items():
        got, _ = run(Path(path), builder_feeds if key == "builder" else strata_feeds)
        report[key + "_max_abs_diff"] = float(np.abs(got - ref).max())
    return report


# -------------------------------------------------------------------- parent


def measured(cmd, work: Path, label: str, timeout: float) -> dict:
    return torchbench.run_measured([str(c) for c in cmd], timeout, work / f"{label}.log")


def dir_bytes(path: Path) -> int:
    """Bytes an export wrote: its own files, not the checkpoint shards strata
    reaches through checkpoint/ (hard links or clones of the source)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and "checkpoint" not in f.relative_to(path).parts[:1])


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def one_dtype(args, dtype: str, work: Path) -> dict:
    ckpt = work / f"ckpt-{dtype}"
    spec = {"layers": args.layers, "hidden": args.hidden, "intermediate": args.intermediate, "heads": args.heads,
            "kv_heads": args.kv_heads, "vocab": args.vocab, "dtype": dtype, "seed": 0}
    built = subprocess.run([sys.executable, __file__, "_child", "build", str(ckpt), json.dumps(spec)], capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(f"building the {dtype} checkpoint failed:\n{built.stderr[-3000:]}")
    params = json.loads(built.stdout.strip().splitlines()[-1])["parameters"]
    row = {"dtype": dtype, "parameters": params, "checkpoint_bytes": sum(f.stat().st_size for f in ckpt.iterdir() if f.is_file())}
    outs = {tool: work / f"{tool}-{dtype}" for tool, _, _, _ in tools_for(dtype)}
    flags = {tool: f for tool, _, f, _ in tools_for(dtype)}
    exports = {tool: [] for tool in outs}
    for i in range(args.runs):
        for tool, out in outs.items():
            subprocess.run(["rm", "-rf", str(out)], check=True)
            cmd = ([args.strata, "-q", "export", ckpt, "--out", out, *flags[tool]] if flags[tool] is not None else
                   [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", ckpt, "-o", out, "-p", "fp32", "-e", "cpu",
                    "-c", work / "hf-cache"])
            m = measured(cmd, work, f"export-{tool}-{dtype}-{i}", args.timeout)
            if m.get("exit_code", 0) != 0:
                raise SystemExit(f"{tool} export of the {dtype} checkpoint failed: see {work}/export-{tool}-{dtype}-{i}.log")
            m["written"] = dir_bytes(out)
            exports[tool].append(m)
    sessions = {tool: [] for tool in outs}
    for i in range(args.runs):
        for tool, out in outs.items():
            sessions[tool].append(measured([sys.executable, "-c", LOAD, out / "model.onnx"], work, f"load-{tool}-{dtype}-{i}", args.timeout))
    for tool in outs:
        row[tool] = {
            "export_wall_s": median_of(exports[tool], "wall_s"), "export_cpu_s": median_of(exports[tool], "cpu_s"),
            "export_peak_rss_bytes": max(r["peak_rss_bytes"] for r in exports[tool]), "written_bytes": exports[tool][-1]["written"],
            "session_s": median_of(sessions[tool], "wall_s"), "session_peak_rss_bytes": statistics.median(r["peak_rss_bytes"] for r in sessions[tool]),
        }
    models = {tool: str(out / "model.onnx") for tool, out in outs.items()}
    got = subprocess.run([sys.executable, __file__, "_child", "logits", str(ckpt), json.dumps(models)], capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"the logits check failed:\n{got.stderr[-3000:]}")
    row["logits"] = json.loads(got.stdout.strip().splitlines()[-1])
    return row


def table(rows: list[dict]) -> str:
    out = ["| checkpoint | tool | export wall | export CPU | export peak RSS | written | session creation | session peak RSS | max abs(Δ logits) vs transformers |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for tool, name, _, _ in tools_for(r["dtype"]):
            x = r[tool]
            out.append(f"| {r['dtype']}, {r['parameters'] / 1e6:.0f}M | {name} | {x['export_wall_s']:.2f} s | {x['export_cpu_s']:.2f} s | "
                       f"{x['export_peak_rss_bytes'] / 2**20:,.0f} MiB | {x['written_bytes'] / 2**20:,.1f} MiB | {x['session_s']:.2f} s | "
                       f"{x['session_peak_rss_bytes'] / 2**20:,.0f} MiB | {r['logits'][tool + '_max_abs_diff']:.1e} (of {r['logits']['scale']:.2f}) |")
        b = r["builder"]
        for tool, name, flags, _ in tools_for(r["dtype"]):
            if flags is None:
                continue
            s = r[tool]
            out.append(f"| | {name.replace('strata export', 'strata')} / builder | {s['export_wall_s'] / b['export_wall_s']:.3f}× | | "
                       f"{s['export_peak_rss_bytes'] / b['export_peak_rss_bytes']:.3f}× | | **{s['session_s'] / b['session_s']:.2f}×** | "
                       f"**{s['session_peak_rss_bytes'] / b['session_peak_rss_bytes']:.3f}×** | |")
    return "\n".join(out)


def main(argv):
    if argv and argv[0] == "_child":
        return child(argv[1:])
    args = parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="strata-bench-ort-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = [one_dtype(args, d.strip(), work) for d in args.dtypes.split(",") if d.strip()]
    res = {"machine": torchbench.machine_facts(), "runs": args.runs, "model": {k: getattr(args, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")}, "rows": rows}
    args.json.write_text(json.dumps(res, indent=2) + "\n")
    print(table(rows))
    subprocess.run(["rm", "-rf", str(work)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
