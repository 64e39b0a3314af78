"""Tables and checks for bench/ort/compare.py's results: the greedy-token
check against transformers and the Markdown tables (export; serving)."""

from __future__ import annotations

# The exports compared, in table order: key, label, strata's export flags
# (None: the builder), and the checkpoint dtypes it is measured on (None: all).
# Materialising weights only changes a half-precision checkpoint's export: it
# writes the float32 weights ONNX Runtime would otherwise fold at every load
# (as the builder does), so a bfloat16 row measures it beside each form.
# --logits last is the serving form of --target ort: the prefill projects
# each row's last token only (onnxruntime-genai reads nothing else).
TOOLS = (("strata", "strata export", [], None),
         ("strata_subfunctions", "strata export --subfunctions", ["--subfunctions"], None),
         ("strata_materialized", "strata export --subfunctions --weights materialize",
          ["--subfunctions", "--weights", "materialize"], {"bfloat16"}),
         ("strata_ort", "strata export --target ort", ["--target", "ort"], None),
         ("strata_ort_materialized", "strata export --target ort --weights materialize",
          ["--target", "ort", "--weights", "materialize"], {"bfloat16"}),
         ("strata_ort_last", "strata export --target ort --logits last", ["--target", "ort", "--logits", "last"], None),
         ("strata_ort_materialized_last", "strata export --target ort --weights materialize --logits last",
          ["--target", "ort", "--weights", "materialize", "--logits", "last"], {"bfloat16"}),
         ("builder", "ONNX Runtime GenAI builder", None, None))


def tools_for(dtype: str):
    return [t for t in TOOLS if t[3] is None or dtype in t[3]]


def in_row(r: dict):
    """The exports a results row holds: one written before an export joined
    the bench has no entry for it."""
    return [t for t in tools_for(r["dtype"]) if t[0] in r]


def first_difference(got: list[int], want: list[int]) -> int | None:
    """None when equal; else the first step where they differ (a shorter
    list differs where it ends)."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def check_tokens(row: dict, prompts: list[list[int]]) -> None:
    """Marks every serving run and onnxruntime-genai run with
    greedy_differs_at: None when its tokens are transformers'."""
    greedy = row["reference"]["greedy"]
    for tool, _, _, _ in tools_for(row["dtype"]):
        x = row.get(tool, {})
        serve = x.get("serve", {})
        for n, rep in serve.get("lengths", {}).items():
            rep["greedy_differs_at"] = first_difference(rep["tokens"], greedy[n])
        genai = x.get("genai", {})
        if "tokens" in genai:
            genai["greedy_differs_at"] = first_difference(genai["tokens"], greedy[str(len(prompts[0]))])


def checkpoint(r: dict) -> str:
    m = r["parameters"] / 1e6
    return f"{r['dtype']}, {m:.0f}M" if m >= 10 else f"{r['dtype']}, {m:.2f}M"


def ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a is not None and b else ""


def ms(x: float) -> str:
    return f"{x * 1e3:,.1f} ms"


def mib(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


class Notes:
    """Footnotes: each distinct text numbered once."""

    def __init__(self):
        self.texts: list[str] = []

    def mark(self, text: str) -> str:
        text = " ".join(text.split())  # a traceback's lines would break the table
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"


def labelled(r: dict, tool: str, name: str, notes: Notes) -> str:
    if tool == "strata_ort" and r.get("ort_stand_in"):
        return name + " " + notes.mark("test run: the builder's output stands in for strata --target ort (--ort-stand-in).")
    return name


def export_table(res: dict, notes: Notes) -> list[str]:
    out = ["| checkpoint | export | export wall | export CPU | export peak RSS | written | max abs(Δ logits) vs transformers |",
           "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        ck = checkpoint(r)
        for tool, name, _, _ in in_row(r):
            x = r[tool]
            if "unavailable" in x:
                out.append(f"| {ck} | {name} | {x['unavailable']} | | | | |")
                continue
            name = labelled(r, tool, name, notes)
            out.append(f"| {ck} | {name} | {x['export_wall_s']:.2f} s | {x['export_cpu_s']:.2f} s | {mib(x['export_peak_rss_bytes'])} | "
                       f"{x['written_bytes'] / 2**20:,.1f} MiB | {r['reference'][tool + '_max_abs_diff']:.1e} (of {r['reference']['scale']:.2f}) |")
        b = r["builder"]
        for tool, name, flags, _ in tools_for(r["dtype"]):
            s = r.get(tool, {})
            if flags is None or "export_wall_s" not in s:
                continue
            out.append(f"| | {name.replace('strata export', 'strata')} / builder | {ratio(s['export_wall_s'], b['export_wall_s'])} | | "
                       f"{ratio(s['export_peak_rss_bytes'], b['export_peak_rss_bytes'])} | | |")
    return out


def greedy_cell(reps: list[dict], notes: Notes) -> str:
    """yes, or where the first token differs, per prompt length."""
    bad = [f"**no** at {n}: step {rep['greedy_differs_at']}" for n, rep in reps if rep.get("greedy_differs_at") is not None]
    unstable = [n for n, rep in reps if rep.get("runs_agree") is False]
    cell = "; ".join(bad) if bad else "yes"
    if unstable:
        cell += " " + notes.mark(f"runs gave different tokens at prompt length {', '.join(unstable)}.")
    return cell


def genai_cell(g: dict, notes: Notes) -> str:
    if "unavailable" in g or "error" in g:
        return "— " + notes.mark(g.get("unavailable") or g["error"])
    cell = f"{g['tokens_per_s']:,.1f}"
    if g.get("greedy_differs_at") is not None:
        cell += f" (**tokens differ** at step {g['greedy_differs_at']})"
    return cell


def serve_table(res: dict, notes: Notes) -> list[str]:
    lens = [str(n) for n in res["prompts"]]
    head = "| checkpoint | export | session creation | session peak RSS | " + " | ".join(
        f"prefill {n} | decode after {n}" for n in lens) + " | greedy = transformers | onnxruntime-genai tokens/s |"
    out = [head, "|" + "---|" * (6 + 2 * len(lens))]
    blank = " |" * (4 + 2 * len(lens))
    for r in res["rows"]:
        ck = checkpoint(r)
        for tool, name, _, _ in in_row(r):
            x = r[tool]
            if "unavailable" in x:
                out.append(f"| {ck} | {name} | {x['unavailable']} |" + blank[:-2] + " |")
                continue
            name = labelled(r, tool, name, notes)
            s = x["serve"]
            if "error" in s:
                cells = f" serving failed {notes.mark(s['error'])} |" + " |" * (2 * len(lens) + 1)
            else:
                cells = "".join(f" {ms(s['lengths'][n]['prefill_s'])} | {s['lengths'][n]['decode_ms']:.2f} ms |" for n in lens)
                cells += f" {greedy_cell([(n, s['lengths'][n]) for n in lens], notes)} |"
            out.append(f"| {ck} | {name} | {x['session_s']:.2f} s | {mib(x['session_peak_rss_bytes'])} |{cells} {genai_cell(x['genai'], notes)} |")
        b = r["builder"]
        for tool, name, flags, _ in tools_for(r["dtype"]):
            s = r.get(tool, {})
            if flags is None or "session_s" not in s:
                continue
            cells = ""
            for n in lens:
                sl, bl = s["serve"].get("lengths", {}).get(n), b["serve"].get("lengths", {}).get(n)
                cells += (f" **{ratio(sl['prefill_s'], bl['prefill_s'])}** | **{ratio(sl['decode_ms'], bl['decode_ms'])}** |"
                          if sl and bl else " | |")
            g, bg = s["genai"], b["genai"]
            gr = ratio(g["tokens_per_s"], bg["tokens_per_s"]) if "tokens_per_s" in g and "tokens_per_s" in bg else ""
            out.append(f"| | {name.replace('strata export', 'strata')} / builder | **{ratio(s['session_s'], b['session_s'])}** | "
                       f"**{ratio(s['session_peak_rss_bytes'], b['session_peak_rss_bytes'])}** |{cells} | {gr} |")
    return out


def tables(res: dict) -> str:
    notes = Notes()
    caption = (f"Serving: onnxruntime.InferenceSession, CPU EP, intra_op_num_threads={res['threads']}, IO binding for every "
               f"export (caches stay OrtValues between steps: strata's default feeds its *_RetainedState back, at ctx_len = "
               f"prompt + {res['steps']}; the builder's past and present share one buffer of that length as its genai_config "
               f"says; a builder-style export without a shared buffer feeds present back as past). Prefill: the prompt's wall; "
               f"decode: median of {res['steps']} steps after it; each the median of {res['runs']} runs, each run a process of its "
               f"own that first runs the longest prompt once untimed. "
               f"Greedy: the prefill's token and each step's, against transformers' (float32). onnxruntime-genai: greedy, "
               f"the {res['prompts'][0]}-token prompt, {res['steps'] + 1} new tokens, tokens/s over the whole generate loop "
               f"(prefill included), median of {res['runs']} runs after a warm-up. Session creation: default options, a fresh "
               f"process per run, peak RSS by GNU time.")
    load = "; ".join(f"{r['dtype']} {r['load_average_before_serving'][0]:.1f} before, {r['load_average_after_serving'][0]:.1f} after"
                     for r in res["rows"] if "load_average_before_serving" in r)
    if load:
        caption += f" The machine's 1-minute load average around serving (2 cores): {load}."
    lines = export_table(res, notes) + ["", caption, ""] + serve_table(res, notes)
    if notes.texts:
        lines += [""] + [f"[{i + 1}] {t}" for i, t in enumerate(notes.texts)]
    return "\n".join(lines)
