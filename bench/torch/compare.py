#!/usr/bin/env python3
"""Side-by-side: torch.onnx.export (the path users take today) versus strata.

One run builds a random LlamaForCausalLM, saves it with save_pretrained, then
exports it with torch.onnx.export (KV cache in and out, dynamic axes, external
data) and with `strata export`, each in a child process of its own, and prints
wall time, CPU time, peak RSS and output sizes of both. See README.md beside
this file.

The same file is also the child: `compare.py _child build|torch ...` are the
steps that need torch. Every measured process is started by GNU time, not by
this one (see run_measured), so this process's own memory never enters a figure.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_STRATA = REPO / "bin" / "strata"
DEFAULT_JSON = HERE / "results.json"
EXPORTERS = ("torchscript", "dynamo")
MiB = 1024 * 1024


# ---------------------------------------------------------------- arguments


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark torch.onnx.export against strata export on a random Llama.",
    )
    m = p.add_argument_group("model (a random LlamaForCausalLM)")
    m.add_argument("--layers", type=int, default=16)
    m.add_argument("--hidden", type=int, default=2048)
    m.add_argument("--intermediate", type=int, default=5632)
    m.add_argument("--heads", type=int, default=16)
    m.add_argument("--kv-heads", type=int, default=4)
    m.add_argument("--vocab", type=int, default=32000)
    m.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="dtype the checkpoint is saved in (torch exports in this dtype)")
    m.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("run")
    r.add_argument("--work", type=Path, help="work directory (default: a new temp dir)")
    r.add_argument("--keep", action="store_true", help="keep the work directory")
    r.add_argument("--strata", type=Path, default=DEFAULT_STRATA)
    r.add_argument("--strata-runs", type=int, default=5,
                   help="strata exports to run (median reported: one takes tens of ms)")
    r.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    r.add_argument("--exporters", default="torchscript,dynamo",
                   help="torch.onnx.export paths to run, comma-separated: torchscript (dynamo=False), dynamo")
    r.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa",
                   help="transformers attention implementation for the torch export (sdpa is its default)")
    r.add_argument("--opset", type=int, help="opset for torch.onnx.export (default: the exporter's)")
    r.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed to each child")
    args = p.parse_args(argv)
    args.exporters = [e.strip() for e in args.exporters.split(",") if e.strip()]
    unknown = sorted(set(args.exporters) - set(EXPORTERS))
    if unknown:
        p.error(f"--exporters: unknown {unknown}; known: {', '.join(EXPORTERS)}")
    if args.strata_runs < 1:
        p.error("--strata-runs must be at least 1")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    return args


# ---------------------------------------------------------------- children (they import torch)


def child_main(argv: list[str]) -> int:
    """Entry point of the child processes; writes a JSON report to --report."""
    p = argparse.ArgumentParser(prog="compare.py _child")
    p.add_argument("step", choices=("build", "torch"))
    p.add_argument("--report", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--out", type=Path)
    p.add_argument("--spec", help="build: JSON of the model parameters")
    p.add_argument("--exporter", choices=EXPORTERS)
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--opset", type=int)
    a = p.parse_args(argv)
    report: dict = {"phases_s": {}}
    t0 = time.perf_counter()
    try:
        # Timed apart: a user's export pays for these imports too.
        import torch  # noqa: F401
        import transformers  # noqa: F401

        report["phases_s"]["import"] = time.perf_counter() - t0
        if a.step == "build":
            build_checkpoint(a.model, json.loads(a.spec), report)
        else:
            export_with_torch(a.model, a.out, a.exporter, a.attn, a.opset, report)
        report["ok"] = True
    except Exception as e:  # reported to the parent, which prints why
        report["ok"] = False
        report["error"] = short_error(e)
        report["traceback"] = traceback.format_exc()[-6000:]
    report["phases_s"]["total"] = time.perf_counter() - t0
    a.report.write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


def short_error(e: BaseException) -> str:
    """The line that says why: torch.export wraps its cause in a page of advice,
    with the cause under '## Exception summary'."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    return f"{type(e).__name__}: {first_lines(text, 4)}"


def first_lines(text: str, n: int) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:n]) + ("\n..." if len(lines) > n else "")


def build_checkpoint(model_dir: Path, spec: dict, report: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec["seed"])
    config = LlamaConfig(
        num_hidden_layers=spec["layers"],
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        vocab_size=spec["vocab"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    t = time.perf_counter()
    # Built in the target dtype directly: building in float32 and casting would
    # hold both copies at once.
    torch.set_default_dtype(getattr(torch, spec["dtype"]))
    model = LlamaForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)
    report["phases_s"]["init"] = time.perf_counter() - t
    report["parameters"] = sum(p.numel() for p in model.parameters())
    t = time.perf_counter()
    model.save_pretrained(model_dir)
    report["phases_s"]["save"] = time.perf_counter() - t


def make_flat_kv_wrapper(model):
    """An nn.Module whose forward takes and returns flat tensors.

    torch.onnx.export sees only tensors; transformers 5 wants the past as a
    DynamicCache object, so the wrapper builds one from the past_key.i /
    past_value.i inputs inside forward and unpacks the grown cache into
    present tensors: the graph then has KV cache inputs and outputs, as the
    decode exports of optimum and QEfficient have.
    """
    import torch
    from transformers import DynamicCache

    n_layers = model.config.num_hidden_layers

    class FlatKV(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, position_ids, *past):
            cache = DynamicCache(config=self.model.config)
            for i in range(n_layers):
                # DynamicLayer.update concatenates onto what it holds, so the
                # first update with the past tensors fills layer i with them.
                cache.layers[i].update(past[2 * i], past[2 * i + 1])
            out = self.model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True)
            present = []
            for layer in out.cache.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return FlatKV().eval()


def io_names(n_layers: int) -> tuple[list[str], list[str]]:
    inputs = ["input_ids", "position_ids"]
    outputs = ["logits"]
    for i in range(n_layers):
        inputs += [f"past_key.{i}", f"past_value.{i}"]
        outputs += [f"present_key.{i}", f"present_value.{i}"]
    return inputs, outputs


def example_inputs(config, dtype):
    """Batch 2, 3 new tokens after 5 cached: all sizes distinct and > 1, so no
    tracer or torch.export can mistake one axis for another or specialise on 1."""
    import torch

    batch, seq, past = 2, 3, 5
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    input_ids = torch.randint(0, config.vocab_size, (batch, seq))
    position_ids = (torch.arange(seq) + past).unsqueeze(0).expand(batch, seq).contiguous()
    kv = []
    for _ in range(config.num_hidden_layers):
        kv += [torch.randn(batch, kv_heads, past, head_dim, dtype=dtype) for _ in range(2)]
    return (input_ids, position_ids, *kv)


def dynamic_axes_for(n_layers: int) -> dict:
    axes = {"input_ids": {0: "batch", 1: "seq"}, "position_ids": {0: "batch", 1: "seq"},
            "logits": {0: "batch", 1: "seq"}}
    for i in range(n_layers):
        axes[f"past_key.{i}"] = axes[f"past_value.{i}"] = {0: "batch", 2: "past_len"}
        axes[f"present_key.{i}"] = axes[f"present_value.{i}"] = {0: "batch", 2: "total_len"}
    return axes


def dynamic_shapes_for(n_layers: int) -> tuple:
    """torch.export's form of the same axes, shaped like forward's arguments:
    the *past varargs are one tuple to torch.export."""
    from torch.export import Dim

    batch, seq, past = Dim("batch", min=1), Dim("seq", min=1), Dim("past_len", min=1)
    kv = {0: batch, 2: past}
    return ({0: batch, 1: seq}, {0: batch, 1: seq}, tuple([kv] * (2 * n_layers)))


def export_with_torch(model_dir: Path, out_dir: Path, exporter: str, attn: str,
                      opset: int | None, report: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    t = time.perf_counter()
    # dtype="auto": the checkpoint's own dtype, as a user loading it would.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto", attn_implementation=attn).eval()
    report["phases_s"]["load"] = time.perf_counter() - t
    report["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    n_layers = model.config.num_hidden_layers
    wrapper = make_flat_kv_wrapper(model)
    args = example_inputs(model.config, next(model.parameters()).dtype)
    inputs, outputs = io_names(n_layers)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / "model.onnx"
    t = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run_torch_onnx_export(wrapper, args, onnx_path, exporter, inputs, outputs, n_layers, opset)
        finally:
            # Kept on failure too: the TracerWarnings often say why.
            report["warnings"] = summarize_warnings(caught)
    report["phases_s"]["export"] = time.perf_counter() - t


def run_torch_onnx_export(wrapper, args, onnx_path: Path, exporter: str, inputs: list[str],
                          outputs: list[str], n_layers: int, opset: int | None) -> None:
    import torch

    if exporter == "torchscript":
        # The TorchScript exporter switches to external data by itself once
        # the model passes 2 GB: one file per tensor beside model.onnx.
        torch.onnx.export(wrapper, args, str(onnx_path), dynamo=False, input_names=inputs,
                          output_names=outputs, dynamic_axes=dynamic_axes_for(n_layers),
                          opset_version=opset)
    else:
        torch.onnx.export(wrapper, args, str(onnx_path), dynamo=True, input_names=inputs,
                          output_names=outputs, dynamic_shapes=dynamic_shapes_for(n_layers),
                          opset_version=opset, external_data=True)


def summarize_warnings(caught) -> dict:
    """Counts by category and the distinct messages (TracerWarnings say where a
    trace froze a shape into a constant)."""
    counts: dict[str, int] = {}
    distinct: list[str] = []
    for w in caught:
        name = w.category.__name__
        counts[name] = counts.get(name, 0) + 1
        where = f"{Path(w.filename).name}:{w.lineno}"
        msg = f"{name} at {where}: {first_lines(str(w.message), 2)[:300]}"
        if msg not in distinct:
            distinct.append(msg)
    return {"counts": counts, "distinct": distinct[:20]}


# ---------------------------------------------------------------- measuring a child


def tree_rss_bytes(root: int) -> int:
    """RSS of root and all its descendants now (0 once root is gone)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total


GNU_TIME = Path("/usr/bin/time")


def run_measured(cmd: list[str], timeout: float, log_path: Path) -> dict:
    """Runs cmd under GNU time; returns wall, CPU and peak memory of cmd and its descendants.

    Why GNU time and not os.wait4 / getrusage(RUSAGE_CHILDREN) here: Linux
    starts a child's ru_maxrss at the peak RSS of the process that spawned it
    (exec records the old address space's high-water mark, and with fork or
    vfork that is the spawner's), so every child of this Python process would
    report at least this process's own peak; measured: 14 MB for /usr/bin/true,
    219 MB after this process touched 200 MB. GNU time is a 2 MB spawner.

    Its %M is the wait4 ru_maxrss of its child: the peak RSS of the LARGEST
    SINGLE process among the child and the descendants it waited for (strata's
    plugins), not of their sum; getrusage(RUSAGE_CHILDREN) would be the same
    kind of maximum, a running one over all children. The sum over the tree
    (strata's host and plugin live at once) is sampled from /proc, every 2 ms
    for the first second and every 50 ms after: it can miss a peak shorter
    than that. CPU is user+sys of the whole tree.
    """
    time_path = log_path.with_suffix(".time")
    full = [str(GNU_TIME), "-f", "%e %U %S %M", "-o", str(time_path), *cmd]
    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        # A session of its own, so a timeout can stop the whole tree by its group id.
        proc = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        peak_tree, samples = 0, 0
        stop = threading.Event()

        def sample():
            nonlocal peak_tree, samples
            while not stop.is_set():
                peak_tree = max(peak_tree, tree_rss_bytes(proc.pid))
                samples += 1
                # Dense while a run may still be short (strata's take tens of
                # ms), sparse afterwards so polling /proc steals no CPU from
                # a long torch export on a 2-core machine.
                stop.wait(0.002 if time.perf_counter() - t0 < 1.0 else 0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except BaseException:
            # Ctrl-C reaches only our own process group, not the child's session.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            stop.set()
        wall = time.perf_counter() - t0
        sampler.join()
    # GNU time puts "Command exited with non-zero status N" before the figures.
    lines = time_path.read_text().split("\n") if time_path.exists() else []
    figures = next((ln.split() for ln in reversed(lines) if len(ln.split()) == 4), None)
    if figures is None and not timed_out:
        raise RuntimeError(f"no figures from GNU time in {time_path}: {lines}")
    # A timeout kills GNU time too: then only wall time and the samples are known.
    _, user, system, maxrss_kib = figures or ("0", "0", "0", "0")
    return {
        "exit_code": proc.returncode,
        "timed_out": timed_out,
        "wall_s": wall,
        "user_s": float(user),
        "sys_s": float(system),
        "cpu_s": float(user) + float(system),
        "peak_rss_bytes": int(maxrss_kib) * 1024,
        "peak_tree_rss_sampled_bytes": peak_tree,
        "tree_rss_samples": samples,
    }


def run_child(step: str, label: str, extra: list[str], work: Path, timeout: float) -> dict:
    """Runs `compare.py _child STEP` measured; label names its log and report files."""
    report_path = work / f"{label}.report.json"
    report_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", step, "--report", str(report_path), *extra]
    m = run_measured(cmd, timeout, work / f"{label}.log")
    m["log"] = str(work / f"{label}.log")
    if m["timed_out"]:
        m["child"] = {"ok": False, "error": f"timed out after {timeout:.0f} s (--timeout)"}
    elif report_path.exists():
        m["child"] = json.loads(report_path.read_text())
    else:
        m["child"] = {"ok": False, "error": f"child died (exit {m['exit_code']}) without a report; see {m['log']}"}
    return m


# ---------------------------------------------------------------- the two exports


def build(args: argparse.Namespace, work: Path) -> tuple[Path, dict]:
    model_dir = work / "checkpoint"
    spec = {k: getattr(args, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads",
                                          "vocab", "dtype", "seed")}
    print(f"building a random Llama ({spec}) in {model_dir} ...", flush=True)
    m = run_child("build", "build", ["--model", str(model_dir), "--spec", json.dumps(spec)], work, args.timeout)
    if not m["child"].get("ok"):
        sys.exit(f"building the checkpoint failed: {m['child'].get('error')}\n{m['child'].get('traceback', '')}")
    size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    info = {"spec": spec, "parameters": m["child"]["parameters"], "safetensors_bytes": size,
            "wall_s": m["wall_s"], "phases_s": m["child"]["phases_s"]}
    print(f"  {info['parameters'] / 1e6:.1f} M parameters, {size / MiB:.0f} MiB of safetensors, "
          f"{m['wall_s']:.1f} s", flush=True)
    return model_dir, info


def export_torch(args: argparse.Namespace, exporter: str, model_dir: Path, work: Path) -> dict:
    out = work / f"torch-{exporter}"
    print(f"torch.onnx.export ({exporter}) ...", flush=True)
    extra = ["--model", str(model_dir), "--out", str(out), "--exporter", exporter, "--attn", args.attn]
    if args.opset:
        extra += ["--opset", str(args.opset)]
    m = run_child("torch", f"torch-{exporter}", extra, work, args.timeout)
    m["name"] = f"torch.onnx.export dynamo={exporter == 'dynamo'}"
    m["ok"] = bool(m["child"].get("ok"))
    if m["ok"]:
        m["output"] = inspect_export(out / "model.onnx", model_dir)
    else:
        m["error"] = m["child"].get("error", "unknown")
    report_row(m)
    return m


def export_strata(args: argparse.Namespace, model_dir: Path, work: Path) -> dict:
    """Runs strata --strata-runs times, each into a new directory.

    A strata export takes tens of milliseconds, so one run's wall time is
    mostly process and plugin start-up noise: the row reports the median wall
    and CPU and the largest peak RSS; every run is kept in the JSON.
    """
    print(f"strata export (x{args.strata_runs}) ...", flush=True)
    runs = []
    for i in range(args.strata_runs):
        out = work / f"strata-{i}"
        log = work / f"strata-{i}.log"
        m = run_measured([str(args.strata), "export", str(model_dir), "--out", str(out)], args.timeout, log)
        m["log"] = str(log)
        if m["timed_out"]:
            m.update(name="strata export", ok=False, error=f"timed out after {args.timeout:.0f} s (--timeout)")
            report_row(m)
            return m
        if m["exit_code"] != 0:
            m.update(name="strata export", ok=False, error=f"exit {m['exit_code']}: " + tail(log, 15))
            report_row(m)
            return m
        runs.append(m)
    row = {
        "name": "strata export", "ok": True, "exit_code": 0, "runs": runs, "log": runs[0]["log"],
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "user_s": statistics.median(r["user_s"] for r in runs),
        "sys_s": statistics.median(r["sys_s"] for r in runs),
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
        "peak_tree_rss_sampled_bytes": max(r["peak_tree_rss_sampled_bytes"] for r in runs),
        "strata_says": tail(Path(runs[0]["log"]), 5),
    }
    row["output"] = inspect_export(work / "strata-0" / "model.onnx", model_dir)
    report_row(row)
    return row


def tail(path: Path, n: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def report_row(m: dict) -> None:
    if m["ok"]:
        o = m["output"]
        print(f"  {fmt_s(m['wall_s'])} wall, {fmt_s(m['cpu_s'])} CPU, peak RSS {m['peak_rss_bytes'] / MiB:.0f} MiB; "
              f".onnx {o['onnx_bytes'] / MiB:.2f} MiB, external data {o['external_bytes'] / MiB:.0f} MiB "
              f"in {o['external_files']} files", flush=True)
    else:
        print(f"  FAILED after {fmt_s(m['wall_s'])}: {m['error']}", flush=True)


# ---------------------------------------------------------------- looking at an export


def inspect_export(onnx_path: Path, source_dir: Path) -> dict:
    """Sizes of the .onnx and of the external data it points at, and whether
    onnx loads it (graph only: external data is not read)."""
    import onnx

    info: dict = {"onnx_bytes": onnx_path.stat().st_size}
    model = onnx.load(str(onnx_path), load_external_data=False)
    locations = set()
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            locations.add(next(e.value for e in init.external_data if e.key == "location"))
    files = [onnx_path.parent / loc for loc in sorted(locations)]
    source_inodes = {(f.stat().st_dev, f.stat().st_ino) for f in source_dir.iterdir() if f.is_file()}
    info["external_files"] = len(files)
    info["external_bytes"] = sum(f.stat().st_size for f in files)
    # Hard links into the checkpoint are the same inode: no byte was written.
    info["external_bytes_written"] = sum(f.stat().st_size for f in files
                                         if (f.stat().st_dev, f.stat().st_ino) not in source_inodes)
    # Everything the export put on disk (strata's weight_spec.json too), each inode once.
    written = {(f.stat().st_dev, f.stat().st_ino): f.stat().st_size
               for f in onnx_path.parent.rglob("*") if f.is_file()}
    info["bytes_written"] = sum(size for key, size in written.items() if key not in source_inodes)
    info["initializers"] = len(model.graph.initializer)
    info["nodes"] = len(model.graph.node)
    info["opset"] = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    info["inputs"] = [describe_value(v) for v in model.graph.input]
    info["outputs"] = [describe_value(v) for v in model.graph.output]
    info["onnx_load"] = "ok"
    return info


def describe_value(v) -> str:
    dims = [d.dim_param or str(d.dim_value) for d in v.type.tensor_type.shape.dim]
    return f"{v.name}[{','.join(dims)}]"


# ---------------------------------------------------------------- facts and report


def machine_facts() -> dict:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    return {"cpu_model": cpu, "cores": os.cpu_count(), "ram_bytes": mem_kib * 1024,
            "kernel": platform.release(), "python": platform.python_version()}


def versions(strata: Path) -> dict:
    v = {}
    for pkg in ("torch", "transformers", "onnx", "onnxscript", "onnx-ir", "safetensors", "numpy"):
        try:
            v[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            v[pkg] = None
    try:
        archs = subprocess.run([str(strata), "archs", "--json"], capture_output=True, text=True, timeout=120)
        v["strata_archs"] = json.loads(archs.stdout) if archs.returncode == 0 else archs.stderr.strip()
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        v["strata_archs"] = f"unavailable: {e}"
    return v


def fmt_s(x: float) -> str:
    return f"{x:.2f} s" if x < 10 else f"{x:.1f} s" if x < 100 else f"{x:.0f} s"


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}×" if x < 10 else f"{x:,.0f}×"


def fmt_mib(b: float | None) -> str:
    return "-" if b is None else f"{b / MiB:,.0f} MiB" if b >= 10 * MiB else f"{b / MiB:.2f} MiB"


def markdown_table(rows: list[dict], strata: dict) -> str:
    head = ("| exporter | wall | CPU (user+sys) | peak RSS, largest process | peak RSS, process tree (sampled) "
            "| .onnx | external data (files) | all bytes written | wall ×strata | peak RSS ×strata (largest / tree) |")
    lines = [head, "|" + "---|" * 10]
    for m in rows:
        if not m["ok"]:
            lines.append(f"| {m['name']} | failed after {fmt_s(m['wall_s'])} | {fmt_s(m['cpu_s'])} | "
                         f"{fmt_mib(m['peak_rss_bytes'])} | {fmt_mib(m['peak_tree_rss_sampled_bytes'])} "
                         f"| - | - | - | - | - |")
            continue
        o = m["output"]
        ratios = ("-", "-")
        if m is not strata and strata["ok"]:
            # Both memory ratios: strata is two processes (host and plugin),
            # torch one, so the largest-process ratio alone would flatter strata.
            ratios = (fmt_ratio(ratio(m["wall_s"], strata["wall_s"])),
                      fmt_ratio(ratio(m["peak_rss_bytes"], strata["peak_rss_bytes"])) + " / "
                      + fmt_ratio(ratio(m["peak_tree_rss_sampled_bytes"], strata["peak_tree_rss_sampled_bytes"])))
        lines.append(f"| {m['name']} | {fmt_s(m['wall_s'])} | {fmt_s(m['cpu_s'])} | {fmt_mib(m['peak_rss_bytes'])} "
                     f"| {fmt_mib(m['peak_tree_rss_sampled_bytes'])} | {fmt_mib(o['onnx_bytes'])} "
                     f"| {fmt_mib(o['external_bytes'])} ({o['external_files']}) | {fmt_mib(o['bytes_written'])} "
                     f"| {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)


def ratio(a: float, b: float) -> float | None:
    # None where strata's figure is 0: a sampled tree RSS can miss a short run.
    return a / b if b else None


def ratios(rows: list[dict], strata: dict) -> dict:
    out = {}
    if not strata["ok"]:
        return out
    for m in rows:
        if m is strata or not m["ok"]:
            continue
        out[m["name"]] = {
            "wall": ratio(m["wall_s"], strata["wall_s"]),
            "peak_rss": ratio(m["peak_rss_bytes"], strata["peak_rss_bytes"]),
            "peak_tree_rss_sampled": ratio(m["peak_tree_rss_sampled_bytes"], strata["peak_tree_rss_sampled_bytes"]),
            "cpu": ratio(m["cpu_s"], strata["cpu_s"]),
        }
    return out


# ---------------------------------------------------------------- main


def check_tools() -> None:
    if not os.access(GNU_TIME, os.X_OK):
        sys.exit(f"{GNU_TIME} (GNU time) is needed to measure peak RSS: apt-get install time")


def check_strata(path: Path) -> Path:
    path = path.resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        sys.exit(f"strata not found at {path}: run `make build` in {REPO} first (or pass --strata PATH)")
    return path


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    check_tools()
    args.strata = check_strata(args.strata)
    work = args.work.resolve() if args.work else Path(tempfile.mkdtemp(prefix="strata-vs-torch-"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    try:
        facts, vers = machine_facts(), versions(args.strata)
        model_dir, model_info = build(args, work)
        # strata first: it reads headers only, so whatever page-cache state the
        # torch runs leave behind cannot help it.
        strata = export_strata(args, model_dir, work)
        rows = [export_torch(args, e, model_dir, work) for e in args.exporters] + [strata]
        results = {
            "model": model_info, "machine": facts, "versions": vers,
            "settings": {"attn": args.attn, "opset": args.opset, "exporters": args.exporters,
                         "work": str(work), "kept": args.keep},
            "runs": rows, "ratios_vs_strata": ratios(rows, strata),
            "total_wall_s": time.perf_counter() - t_start,
        }
        table = markdown_table(rows, strata)
        print()
        print(f"random Llama: {model_info['parameters'] / 1e6:.1f} M parameters, {args.dtype}, "
              f"{fmt_mib(model_info['safetensors_bytes'])} of safetensors; "
              f"{facts['cpu_model']}, {facts['cores']} cores, {fmt_mib(facts['ram_bytes'])} RAM")
        print()
        print(table)
        print_failures_and_notes(rows)
        results["table_markdown"] = table
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nresults: {args.json}  (whole run {results['total_wall_s']:.0f} s)")
        return 0 if all(m["ok"] for m in rows) else 1
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def print_failures_and_notes(rows: list[dict]) -> None:
    for m in rows:
        if not m["ok"]:
            print(f"\n{m['name']} failed: {m['error']}")
        child = m.get("child", {})
        if child.get("phases_s"):
            phases = ", ".join(f"{k} {v:.1f} s" for k, v in child["phases_s"].items())
            print(f"\n{m['name']} phases: {phases}")
        tracer = child.get("warnings", {}).get("counts", {}).get("TracerWarning")
        if tracer:
            print(f"  {tracer} TracerWarnings (shapes the trace may have frozen); see the JSON")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        sys.exit(child_main(sys.argv[2:]))
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit("interrupted: children stopped, work directory removed unless --keep")
