#!/usr/bin/env python3
"""`make bench-ort-smoke`: the bench-ort harness end to end on a tiny Llama
(2 layers, hidden 64; under a minute), in bench/ort's environment (torch).

Checks what a full run relies on:
- every export's greedy tokens are transformers' at both prompt lengths, and
  the logits agree (a bfloat16 checkpoint's --target ort, as exported and
  with --weights materialize, too);
- strata without --target ort gives that column "not available: <strata's
  first stderr line>" and the run goes on;
- with --ort-stand-in (the builder's output as the --target ort export) the
  column's driver and onnxruntime-genai run and give transformers' tokens;
- the builder-style driver gives the same tokens with a shared past/present
  buffer and with a growing past;
- a wrong token is reported in the table, never passed over silently.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(1, str(HERE))
import report  # noqa: E402
import serve  # noqa: E402

TINY = ["--layers", "2", "--hidden", "64", "--intermediate", "128", "--heads", "4", "--kv-heads", "2", "--vocab", "512",
        "--runs", "1", "--prompts", "16,40", "--steps", "6", "--dtypes", "float32"]


def run(work: Path, name: str, *extra: str) -> dict:
    out = work / f"{name}.json"
    done = subprocess.run([sys.executable, str(HERE / "compare.py"), *TINY, "--work", str(work / name), "--json", str(out), *extra],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"compare.py {' '.join(extra)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"bench-ort smoke: {what}")


def check_row(row: dict, tools: list[str]) -> None:
    for tool in tools:
        lengths = row[tool]["serve"].get("lengths")
        expect(lengths is not None, f"{tool} did not serve: {row[tool]['serve']}")
        for n, rep in lengths.items():
            expect(rep["greedy_differs_at"] is None, f"{tool} at {n} tokens: greedy tokens {rep['tokens']} are not "
                   f"transformers' {row['reference']['greedy'][n]}")
            expect(rep["prefill_s"] > 0 and rep["decode_ms"] > 0, f"{tool} at {n} tokens: no timing")
        expect(row["reference"][tool + "_max_abs_diff"] < 1e-4, f"{tool}: logits off by {row['reference'][tool + '_max_abs_diff']}")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="strata-bench-ort-smoke-"))
    try:
        plain = run(work, "plain")
        row = plain["rows"][0]
        check_row(row, ["strata", "strata_subfunctions", "builder"])
        if "unavailable" in row["strata_ort"]:
            expect(row["strata_ort"]["unavailable"].startswith("not available: strata: "),
                   f"the --target ort column says {row['strata_ort']['unavailable']!r}, not strata's error")
            expect(row["strata_ort"]["unavailable"] in report.tables(plain), "the table leaves out why --target ort is not available")
        else:  # strata knows --target ort: its exports are served like the others
            check_row(row, ["strata_ort", "strata_ort_last"])
            expect(row["strata_ort_last"]["genai"]["greedy_differs_at"] is None,
                   f"onnxruntime-genai on --target ort --logits last: {row['strata_ort_last']['genai']}")
        expect(row["builder"]["genai"]["greedy_differs_at"] is None, f"onnxruntime-genai's tokens: {row['builder']['genai']}")
        expect("unavailable" in row["strata"]["genai"], "onnxruntime-genai ran strata's default export, which has no genai_config.json")

        # bfloat16: --target ort beside --target ort --weights materialize (that row's own column).
        half = run(work, "bfloat16", "--dtypes", "bfloat16")["rows"][0]
        check_row(half, ["strata_ort", "strata_ort_materialized", "strata_ort_materialized_last", "builder"])
        expect(half["strata_ort_materialized"]["genai"]["greedy_differs_at"] is None,
               f"onnxruntime-genai on --target ort --weights materialize: {half['strata_ort_materialized']['genai']}")

        stand = run(work, "standin", "--ort-stand-in")
        srow = stand["rows"][0]
        check_row(srow, ["strata_ort", "builder"])
        expect(srow["strata_ort"]["genai"]["greedy_differs_at"] is None, f"genai on the stand-in: {srow['strata_ort']['genai']}")
        expect("stands in" in report.tables(stand), "the table does not say the --target ort column is a stand-in")

        # The builder-style driver, shared buffer and growing past alike.
        builder = work / "standin" / "builder-float32" / "model.onnx"
        spec = {"prompts": [[5, 9, 200, 17, 3, 88, 41, 400, 7, 12]], "steps": 5, "runs": 1, "threads": 2, "head_dim": 16}
        shared = serve.serve_ort(builder, {**spec, "shared_buffer": True})
        growing = serve.serve_ort(builder, {**spec, "shared_buffer": False})
        expect(shared["shared_buffer"] and not growing["shared_buffer"], "the driver ignored shared_buffer")
        shared, growing = (r["lengths"]["10"]["runs"][0]["tokens"] for r in (shared, growing))
        expect(len(shared) == 6 and shared == growing, f"shared buffer {shared} != growing past {growing}")

        # A wrong token shows in the table.
        bad = copy.deepcopy(stand)
        brow = bad["rows"][0]
        brow["strata_ort"]["serve"]["lengths"]["40"]["tokens"][3] += 1
        brow["builder"]["genai"]["tokens"] = brow["builder"]["genai"]["tokens"][:-1]
        report.check_tokens(brow, [[0] * 16, [0] * 40])
        table = report.tables(bad)
        expect("**no** at 40: step 3" in table, "a wrong decode token is not in the table")
        expect("**tokens differ** at step 6" in table, "onnxruntime-genai's short generation is not in the table")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("bench-ort smoke: ok (default, --subfunctions, builder and the --target ort columns, bfloat16's materialised one; genai; shared and growing past; mismatches reported)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
