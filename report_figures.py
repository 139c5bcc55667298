"""The report's pictures of one plan, as plotly figures: memory per pipeline rank stacked by kind
against the device limit, the step time split, the pipeline schedule, the mesh over nodes and GPUs,
and the runners-up (time against memory).

Memory per pipeline rank comes from the cost model (``cost_model.footprint.rank_memory``) on the
plan's model dimensions; the most loaded rank is the plan's prediction. Values are plotted in GB
and ms, exactly the plan's bytes / 1e9 and seconds * 1e3.
"""
from __future__ import annotations

from typing import Any

from . import ir
from .report_schedule import idle, timeline

GB, MS = 1e9, 1e3
MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "buffers")
TIME_KINDS = (("compute", "compute"), ("exposed_comm", "exposed communication"), ("bubble", "pipeline bubble"),
              ("unpriced", "unpriced (calibration)"))
OP_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}
COLORS = {"F": "#4c78a8", "B": "#f58518", "W": "#54a24b", "idle": "#d9d9d9"}


def rank_memory_bytes(plan: ir.Plan) -> list[dict[str, float]]:
    """Bytes per GPU of each pipeline rank, by kind."""
    from .cost_model.footprint import rank_memory
    from .cost_model.pipeline import rank_layers
    from .cost_model.summary import summarize

    c = plan.model
    dims = ir.graph.ModelDims(family=c["family"], layers=c["layers"], hidden=c["hidden"], heads=c["heads"],
                              kv_heads=c.get("kv_heads") or c["heads"], ffn_hidden=c["ffn_hidden"], vocab=c["vocab"],
                              experts=c.get("experts", 0), top_k=c.get("top_k", 0), head_dim=c.get("head_dim", 0))
    summary = summarize(ir.Graph(nodes=(), params=(), blocks=(), dims=dims))
    return [rank_memory(summary, plan, r) for r in rank_layers(plan, dims.layers)]


def memory_figure(plan: ir.Plan, go: Any) -> Any:
    ranks = rank_memory_bytes(plan)
    x = [f"pp rank {r}" for r in range(len(ranks))]
    fig = go.Figure([go.Bar(name=kind, x=x, y=[m[kind] / GB for m in ranks], meta=kind,
                            hovertemplate="%{x}: %{y:.2f} GB " + kind + "<extra></extra>") for kind in MEMORY_KINDS])
    limit = plan.prediction.memory_limit_bytes if plan.prediction else 0.0
    if limit:
        fig.add_trace(go.Scatter(name="device limit", x=x, y=[limit / GB] * len(x), mode="lines+markers",
                                 meta="limit", line={"color": "#d62728", "dash": "dash"}))
    fig.update_layout(barmode="stack", title="memory per GPU of each pipeline rank (GB)", yaxis_title="GB")
    return fig


def time_figure(plan: ir.Plan, go: Any) -> Any:
    t = plan.prediction.time_s
    fig = go.Figure([go.Bar(name=label, y=["step"], x=[t[key] * MS], orientation="h", meta=key,
                            text=[f"{t[key] * MS:.1f} ms"], hovertemplate=label + ": %{x:.1f} ms<extra></extra>")
                     for key, label in TIME_KINDS if key in t])
    fig.update_layout(barmode="stack", title=f"step time {plan.prediction.step_time_s * MS:.1f} ms (ms)",
                      xaxis_title="ms", height=260)
    return fig


def schedule_figure(plan: ir.Plan, go: Any) -> Any:
    blocks = timeline(plan)
    p = plan.mesh.pp
    fig = go.Figure()
    for kind in ("F", "B", "W"):
        mine = [b for b in blocks if b.op.kind == kind]
        if not mine:
            continue
        fig.add_trace(go.Bar(name=OP_NAMES[kind], meta=kind, orientation="h",
                             y=[f"pp rank {b.rank}" for b in mine], base=[b.start_s * MS for b in mine],
                             x=[(b.end_s - b.start_s) * MS for b in mine], marker_color=COLORS[kind],
                             text=[str(b.op.microbatch) for b in mine], textposition="inside",
                             customdata=[[b.op.chunk, b.op.microbatch] for b in mine],
                             hovertemplate="chunk %{customdata[0]}, micro-batch %{customdata[1]}<extra></extra>"))
    gaps = idle(blocks, p)
    if gaps:
        fig.add_trace(go.Bar(name="idle (bubble)", meta="idle", orientation="h", y=[f"pp rank {r}" for r, _, _ in gaps],
                             base=[s * MS for _, s, _ in gaps], x=[(e - s) * MS for _, s, e in gaps],
                             marker_color=COLORS["idle"], hovertemplate="idle %{x:.1f} ms<extra></extra>"))
    what = (f"{plan.schedule}" + (f", vp={plan.vp}" if plan.vp > 1 else "") if p > 1
            else "no pipeline: gradient accumulation")
    fig.update_layout(barmode="overlay", title=f"pipeline schedule ({what}): {plan.num_microbatches} micro-batches; "
                      "the number is the micro-batch", xaxis_title="ms (compute only)",
                      yaxis={"autorange": "reversed"}, height=180 + 40 * p)
    return fig


def _gpus_per_node(plan: ir.Plan) -> int:
    from .cost_model import parse_cluster

    try:
        per_node = parse_cluster(plan.cluster).gpus_per_node
    except (ir.PlanError, OSError, ValueError):
        per_node = 8
    return max(1, min(per_node, plan.world_size))


def rank_coords(plan: ir.Plan, rank: int) -> dict[str, int]:
    """The rank's index on each mesh axis: pp outermost, tp innermost (``codegen.BuildMesh``);
    ep groups consecutive ranks of dp x cp."""
    m, coords = plan.mesh, {}
    for axis in ("tp", "cp", "dp", "pp"):
        coords[axis] = rank % getattr(m, axis)
        rank //= getattr(m, axis)
    coords["ep"] = (coords["dp"] * m.cp + coords["cp"]) % m.ep
    return coords


def mesh_figure(plan: ir.Plan, go: Any) -> Any:
    per_node = _gpus_per_node(plan)
    nodes = -(-plan.world_size // per_node)
    shown = [a for a in ir.AXES if getattr(plan.mesh, a) > 1] or ["dp"]
    z, text = [], []
    for node in range(nodes):
        z_row, t_row = [], []
        for gpu in range(per_node):
            rank = node * per_node + gpu
            if rank >= plan.world_size:
                z_row.append(None)
                t_row.append("")
                continue
            c = rank_coords(plan, rank)
            z_row.append(c["pp"])
            t_row.append(f"r{rank}<br>" + " ".join(f"{a}{c[a]}" for a in shown))
        z.append(z_row)
        text.append(t_row)
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", hoverinfo="text", colorscale="Viridis",
                               showscale=plan.mesh.pp > 1, colorbar={"title": "pp stage"}, xgap=2, ygap=2,
                               x=[f"GPU {g}" for g in range(per_node)], y=[f"node {n}" for n in range(nodes)]))
    fig.update_layout(title=f"mesh {plan.mesh} over {nodes} nodes x {per_node} GPUs (colour: pipeline stage)",
                      yaxis={"autorange": "reversed"}, height=160 + 48 * nodes)
    return fig


def alternatives_figure(plan: ir.Plan, go: Any) -> Any:
    alts = plan.solver.alternatives if plan.solver else ()
    pred = plan.prediction
    fig = go.Figure([go.Scatter(name="runners-up", meta="alternatives", mode="markers",
                                x=[a["peak_memory_bytes"] / GB for a in alts], y=[a["step_time_s"] * MS for a in alts],
                                text=[f"{a['summary']}<br>{a['why']}" for a in alts], hoverinfo="text",
                                marker={"size": 11, "color": "#9e9e9e"}),
                     go.Scatter(name="chosen", meta="chosen", mode="markers", x=[pred.peak_memory_bytes / GB],
                                y=[pred.step_time_s * MS], text=[plan.summary()], hoverinfo="text",
                                marker={"size": 18, "symbol": "star", "color": "#d62728"})])
    fig.update_layout(title="the chosen plan and the runners-up: step time against peak memory",
                      xaxis_title="peak memory per GPU (GB)", yaxis_title="step time (ms)")
    return fig


def figures(plan: ir.Plan) -> dict[str, Any]:
    """The report's figures of ``plan`` by name (needs ``plan.prediction``)."""
    import plotly.graph_objects as go

    if plan.prediction is None:
        raise ir.InvalidPlanError("the plan has no prediction to draw; make it with meshplan plan or estimate")
    out = {"memory": memory_figure(plan, go), "time": time_figure(plan, go), "schedule": schedule_figure(plan, go),
           "mesh": mesh_figure(plan, go), "alternatives": alternatives_figure(plan, go)}
    for fig in out.values():
        fig.update_layout(template="plotly_white", margin={"l": 60, "r": 20, "t": 60, "b": 40})
    return out
