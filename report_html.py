"""``to_html(plans, path)``: one self-contained HTML file that opens offline (plotly's JavaScript is
embedded) with, per plan, the summary, memory per pipeline rank, the step time split, the pipeline
schedule, the mesh over nodes and GPUs, and the runners-up; with several plans, a table side by side.

Each figure is stored as JSON in a ``<script type="application/json" class="figure">`` next to its
``<div>`` and drawn by ``Plotly.newPlot`` when the page loads, so that the numbers can be read back
from the file without a browser; each summary cell carries the plan's raw value in ``data-value``.
"""
from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import ir
from .report_figures import GB, MS, figures

STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:left}th{background:#f5f5f5}.plot{min-height:260px}
section.plan{border-top:2px solid #444;margin-top:24px}"""
RENDER = """document.querySelectorAll('script.figure').forEach(function (s) {
  var f = JSON.parse(s.textContent);
  Plotly.newPlot(s.dataset.target, f.data, f.layout, {displaylogo: false, responsive: true});
});"""


def summary_rows(plan: ir.Plan) -> list[tuple[str, str, str, Any]]:
    """(key, label, shown, raw value) of the summary; ``key`` is the path of the value in the plan's JSON."""
    m, pred = plan.mesh, plan.prediction
    rows = [("model.name", "model", str(plan.model.get("name", plan.model.get("family"))), plan.model.get("name")),
            ("cluster", "cluster", f"{plan.cluster} ({plan.world_size} GPUs)", plan.cluster),
            ("global_batch", "global batch", f"{plan.global_batch} x {plan.seq_len} tokens", plan.global_batch),
            ("seq_len", "sequence length", str(plan.seq_len), plan.seq_len)]
    rows += [(f"mesh.{a}", a, str(getattr(m, a)), getattr(m, a)) for a in ir.AXES]
    rows += [("zero_stage", "ZeRO stage", str(plan.zero_stage), plan.zero_stage),
             ("micro_batch_size", "micro-batch size", str(plan.micro_batch_size), plan.micro_batch_size),
             ("num_microbatches", "micro-batches", str(plan.num_microbatches), plan.num_microbatches),
             ("schedule", "schedule", str(plan.schedule), str(plan.schedule)),
             ("vp", "virtual stages per rank", str(plan.vp), plan.vp)]
    if pred is not None:
        rows += [("prediction.step_time_s", "step time", f"{pred.step_time_s * MS:.1f} ms", pred.step_time_s),
                 ("prediction.tokens_per_s", "tokens/s", f"{pred.tokens_per_s:,.0f}", pred.tokens_per_s),
                 ("prediction.mfu", "MFU", f"{pred.mfu:.1%}", pred.mfu),
                 ("prediction.peak_memory_bytes", "peak memory per GPU", f"{pred.peak_memory_bytes / GB:.2f} GB",
                  pred.peak_memory_bytes),
                 ("prediction.memory_limit_bytes", "device memory limit", f"{pred.memory_limit_bytes / GB:.2f} GB",
                  pred.memory_limit_bytes)]
        rows += [(f"prediction.time_s.{k}", k.replace("_", " "), f"{v * MS:.1f} ms", v) for k, v in pred.time_s.items()]
    if plan.solver is not None:
        rows.append(("solver.status", "solver", f"{plan.solver.status}, {plan.solver.candidates} candidates",
                     plan.solver.status))
    return rows


def _json_in_script(value: Any) -> str:
    """JSON that cannot end its <script> element early (no '<', '>' or '&' left as such)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _table(rows: list[tuple[str, str, str, Any]]) -> str:
    cells = [f'<tr data-key="{html.escape(k)}" data-value="{html.escape(json.dumps(v))}"><th>{html.escape(label)}'
             f"</th><td>{html.escape(shown)}</td></tr>" for k, label, shown, v in rows]
    return '<table class="summary">' + "".join(cells) + "</table>"


def _alternatives_table(plan: ir.Plan) -> str:
    alts = plan.solver.alternatives if plan.solver else ()
    if not alts:
        return "<p>No runners-up recorded (everything was pinned, or only one strategy fits).</p>"
    rows = "".join(f"<tr><td>{html.escape(a['summary'])}</td><td>{a['step_time_s'] * MS:.1f} ms</td>"
                   f"<td>{a['peak_memory_bytes'] / GB:.2f} GB</td><td>{html.escape(a['why'])}</td></tr>" for a in alts)
    return ('<table class="alternatives"><tr><th>runner-up</th><th>step</th><th>peak memory</th><th>why it lost'
            f"</th></tr>{rows}</table>")


def plan_section(plan: ir.Plan, index: int) -> str:
    import plotly.io as pio

    title = html.escape(f"{plan.model.get('name') or plan.model.get('family')}: {plan.summary()}")
    parts = [f'<section class="plan" id="plan-{index}"><h2>{title}</h2>', _table(summary_rows(plan))]
    for name, fig in figures(plan).items():
        target = f"plan-{index}-{name}"
        parts.append(f'<div class="plot" id="{target}" data-plot="{name}"></div>'
                     f'<script type="application/json" class="figure" data-target="{target}" data-plot="{name}">'
                     f"{_json_in_script(json.loads(pio.to_json(fig, validate=True)))}</script>")
    parts.append(_alternatives_table(plan))
    parts.append(f'<script type="application/json" class="plan-json" data-plan="{index}">'
                 f"{_json_in_script(plan.to_dict())}</script></section>")
    return "".join(parts)


def compare_table(plans: Sequence[ir.Plan]) -> str:
    """The plans side by side: one row per summary key, one column per plan."""
    per_plan = [{k: (label, shown) for k, label, shown, _ in summary_rows(p)} for p in plans]
    keys = list(dict.fromkeys(k for rows in per_plan for k in rows))
    head = "".join(f"<th>plan {i + 1}</th>" for i in range(len(plans)))
    body = "".join(f"<tr><th>{html.escape(next(r[k][0] for r in per_plan if k in r))}</th>"
                   + "".join(f"<td>{html.escape(r[k][1]) if k in r else ''}</td>" for r in per_plan) + "</tr>"
                   for k in keys)
    return f'<h2>plans side by side</h2><table class="compare"><tr><th></th>{head}</tr>{body}</table>'


def to_html(plans: ir.Plan | Sequence[ir.Plan], path: str | Path) -> Path:
    """Write the report of one plan or several to ``path`` (one file, no network needed to open it)."""
    from plotly.offline import get_plotlyjs

    plans = [plans] if isinstance(plans, ir.Plan) else list(plans)
    if not plans:
        raise ir.InvalidPlanError("to_html needs at least one plan")
    sections = "".join(plan_section(p, i) for i, p in enumerate(plans))
    page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>meshplan report</title>"
            f"<style>{STYLE}</style><script>{get_plotlyjs()}</script></head><body><h1>meshplan report</h1>"
            + (compare_table(plans) if len(plans) > 1 else "") + sections + f"<script>{RENDER}</script></body></html>")
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
