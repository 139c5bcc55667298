"""``meshplan report``, ``export`` and ``compare``: plans people can see and take elsewhere.

    meshplan report PLAN.json [MORE.json ...] -o plan.html      # one self-contained HTML file
    meshplan export PLAN.json --to torchtitan|megatron|deepspeed [-o FILE]
    meshplan compare A.json B.json [...]                         # side by side, with the differences

``cli.py`` registers them with ``add_parser``; bad plan files and plans a framework cannot run exit 2
with one line (``cli.main``)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import ir

GB, MS = 1e9, 1e3


def add_parser(subparsers: Any) -> None:
    rp = subparsers.add_parser("report", help="write plans as one self-contained HTML report with plots")
    rp.add_argument("plans", nargs="+", metavar="PLAN.json")
    rp.add_argument("-o", "--output", required=True, help="the HTML file to write")
    rp.set_defaults(func=cmd_report)
    ex = subparsers.add_parser("export", help="write a plan as torchtitan, Megatron-LM or DeepSpeed runs it")
    ex.add_argument("plan", metavar="PLAN.json")
    ex.add_argument("--to", required=True, choices=("torchtitan", "megatron", "deepspeed"))
    ex.add_argument("-o", "--output", help="write here (default: print)")
    ex.set_defaults(func=cmd_export)
    co = subparsers.add_parser("compare", help="print plans side by side with where time and memory differ")
    co.add_argument("plans", nargs="+", metavar="PLAN.json")
    co.set_defaults(func=cmd_compare)


def add_quiet(*parsers: argparse.ArgumentParser) -> None:
    for p in parsers:
        p.add_argument("-q", "--quiet", action="store_true", help="no progress display")


def cmd_report(args: argparse.Namespace) -> int:
    from .api import load
    from .report_html import to_html

    path = to_html([load(p) for p in args.plans], args.output)
    print(f"wrote {path}: open it in a browser (it needs no network)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .api import load
    from .export import export

    text = export(load(args.plan), args.to)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output} ({args.to})")
    else:
        print(text, end="")
    return 0


def _rows(plan: ir.Plan) -> dict[str, tuple[str, float | None]]:
    """Label -> (shown, number to diff) for one plan."""
    m, pred = plan.mesh, plan.prediction
    rows: dict[str, tuple[str, float | None]] = {
        "model": (str(plan.model.get("name") or plan.model.get("family")), None),
        "cluster": (f"{plan.cluster}", None), "mesh": (str(m), None),
        "zero": (str(plan.zero_stage), None), "micro-batch": (f"{plan.micro_batch_size} x {plan.num_microbatches}", None),
        "schedule": (str(plan.schedule) + (f" vp={plan.vp}" if plan.vp > 1 else "") if m.pp > 1 else "-", None)}
    if pred is not None:
        rows["step ms"] = (f"{pred.step_time_s * MS:.1f}", pred.step_time_s * MS)
        for key in ("compute", "exposed_comm", "bubble", "unpriced"):
            value = pred.time_s.get(key, 0.0)  # unpriced: only on a calibrated accelerator (estimate.calibrated)
            rows[f"  {key} ms"] = (f"{value * MS:.1f}", value * MS)
        rows["peak GB"] = (f"{pred.peak_memory_bytes / GB:.2f}", pred.peak_memory_bytes / GB)
        for key in ("params", "grads", "optimizer", "activations", "buffers"):
            rows[f"  {key} GB"] = (f"{pred.memory_bytes[key] / GB:.2f}", pred.memory_bytes[key] / GB)
        rows["tokens/s"] = (f"{pred.tokens_per_s:,.0f}", pred.tokens_per_s)
    return rows


def compare_text(plans: list[ir.Plan], names: list[str]) -> str:
    """The plans side by side; the last column is each later plan against the first where they differ."""
    tables = [_rows(p) for p in plans]
    labels = list(dict.fromkeys(k for t in tables for k in t))
    width = max(14, *(len(n) for n in names), *(len(shown) for t in tables for shown, _ in t.values()))
    lines = [f"{'':<16}" + "".join(f"{n:>{width + 2}}" for n in names) + "  difference vs " + names[0]]
    for label in labels:
        cells = [t.get(label, ("-", None)) for t in tables]
        line = f"{label:<16}" + "".join(f"{shown:>{width + 2}}" for shown, _ in cells)
        base = cells[0][1]
        diffs = [f"{v - base:+.2f} ({(v - base) / base:+.1%})" for _, v in cells[1:]
                 if base and v is not None and abs(v - base) > 1e-9 * abs(base)]
        if any(shown != cells[0][0] for shown, _ in cells[1:]) and not diffs:
            diffs = ["differs"]
        lines.append(line + ("  " + ", ".join(diffs) if diffs else ""))
    return "\n".join(lines)


def cmd_compare(args: argparse.Namespace) -> int:
    from .api import load

    plans = [load(p) for p in args.plans]
    print(compare_text(plans, [Path(p).stem for p in args.plans]))
    return 0
