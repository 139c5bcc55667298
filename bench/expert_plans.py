"""meshplan's plan against the expert's, for every run of ``bench/data/reference_runs.csv`` (and torchtitan's
FSDP2 runs of ``bench/data/torchtitan_runs.csv``, costed as the torchtitan preset: ``reference_runs.torchtitan_run``).

    python bench/expert_plans.py [--all-parallelisms] [--time-limit S]

For each row: plan the same model on the same cluster with the same global batch and sequence,
then predict both meshplan's plan and the published (expert) plan with the same cost model, and
print the ratio of predicted throughputs; both are costed as the row's own program in its dtype
(its software preset, ``reference_runs.software_of``), and the search offers what that program runs,
as ``meshplan plan --software`` does. A ratio below 1.0 means the search missed a plan it
could have found (or the expert's plan lies outside what the runtime executes: the search offers
only what the runtime can run; ``--all-parallelisms`` lifts that to show what the search would
pick with every parallelism). Rows without a published layout are skipped with the reason.
A benchmark, not a test: it prints and asserts nothing.

Expert layouts beyond an even split (``expert_run``): a row whose ``pp * vp`` does not divide its
layers (Llama 3.1 405B: 126 layers on pp 16 x vp 8) gets Megatron-LM's account-for-embedding/loss
split, and the optional columns ``first_stage_layers`` / ``last_stage_layers`` (Megatron's
``--decoder-first/last-pipeline-num-layers``) and ``zero_group`` (an FSDP2/HSDP shard group, which
may span nodes) are applied where a row has them. ``--rows TEXT`` keeps the rows whose model
contains TEXT. In the plan columns ``ep8f`` is ep 8 folded over tp by choice (``ir.Mesh.fold_ep``: Megatron's
``--expert-tensor-parallel-size 1`` where ep fits in dp), ``g`` an HSDP shard group, ``rc:`` the recomputation.
"""
from __future__ import annotations

import argparse
import csv
import time
from dataclasses import replace

from reference_runs import DATA, TORCHTITAN_CSV, build_run, software_of_run, torchtitan_run

from meshplan import ir, solver
from meshplan.cost_model import estimate
from meshplan.solver.space import MEGATRON, RUNTIME
from meshplan.solver.stages import bounds, megatron_counts

ALL = frozenset({"tp", "sp", "zero1", "zero1_tp", "zero2", "zero3", "moe_tp", "pp", "cp", "ep"})


def _short(plan: ir.Plan) -> str:
    m = plan.mesh
    parts = [f"{a}{getattr(m, a)}" + ("f" if a == "ep" and m.fold_ep else "")  # ep8f: ep8 folded over tp by choice
             for a in ("tp", "pp", "dp", "cp", "ep") if getattr(m, a) > 1 or a == "dp"]
    rc = {r[0] for r in plan.recompute} - {"n"}
    uneven = len({b - a for a, b in plan.stages}) > 1
    return (" ".join(parts) + f" mb{plan.micro_batch_size} z{plan.zero_stage}"
            + (f" g{plan.zero_group}" if plan.zero_group else "")
            + (f" v{plan.vp}" if plan.vp > 1 else "") + (" uneven" if uneven else "") + (" rc:" + "".join(sorted(rc)) if rc else ""))


def _optional(row: dict[str, str], column: str) -> int | None:
    text = (row.get(column) or "").strip()
    return int(text) if text else None


def expert_run(row: dict[str, str]):
    """``build_run``'s run with the row's uneven pipeline layout and shard group (module docstring), or
    why the row cannot be expressed."""
    if not (row.get("measured_tflops_per_gpu") or "").strip() and not (row.get("measured_mfu") or "").strip():
        row = {**row, "measured_mfu": "0"}  # a published plan without a throughput: the comparison needs none
    run = build_run(row)
    uneven = isinstance(run, str) and "do not split into" in run
    if uneven:  # build it without interleaving, then give it Megatron's layout
        run = build_run({**row, "vp": ""})
    if isinstance(run, str):
        return run
    plan, vp = run.plan, _optional(row, "vp") or 1
    first, last = _optional(row, "first_stage_layers"), _optional(row, "last_stage_layers")
    try:
        if plan.mesh.pp > 1 and (uneven or first is not None or last is not None):
            layers = run.graph.dims.layers
            counts = (megatron_counts(layers, plan.mesh.pp, vp, first=first, last=last)
                      if first is not None or last is not None
                      else megatron_counts(layers, plan.mesh.pp, vp, embedding=True, loss=True))
            plan = replace(plan, vp=vp, schedule="interleaved-1f1b" if vp > 1 else plan.schedule, stages=bounds(counts))
        if _optional(row, "zero_group"):
            plan = replace(plan, zero_group=_optional(row, "zero_group"))
    except ir.PlanError as exc:
        return f"not expressible: {exc}"
    return replace(run, plan=plan)


def compare(run, runtime: frozenset | None, time_limit_s: float) -> tuple[str, str, float, float, str]:
    """Both plans costed as the row's program in its dtype (``meshplan plan --software``); the search offers
    what that program runs (Megatron-Core's options for the framework presets, meshplan runtime's for the
    presets derived from it) unless ``runtime`` says otherwise."""
    graph, software = run.graph, software_of_run(run)
    if runtime is None:
        runtime = MEGATRON if software.search_space == "megatron" else RUNTIME
    expert = estimate(graph, run.cluster, run.plan, software=software)
    req = solver.Request(graph=graph, cluster=run.cluster, model=run.plan.model, global_batch=run.plan.global_batch,
                         seq_len=run.plan.seq_len, dtype=run.plan.dtype, runtime=runtime, top=1,
                         time_limit_s=time_limit_s, software=software)
    start = time.perf_counter()
    try:
        ours = solver.solve(req)[0]
    except ir.PlanError as exc:
        return _short(run.plan), f"none: {exc}"[:60], 0.0, time.perf_counter() - start, ""
    wall = time.perf_counter() - start
    note = "expert OOM in our model" if expert.peak_memory_bytes > expert.memory_limit_bytes else ""
    return _short(run.plan), _short(ours), expert.step_time_s / ours.prediction.step_time_s, wall, note


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", default=str(DATA / "reference_runs.csv"))
    ap.add_argument("--all-parallelisms", action="store_true")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--rows", default="", help="only the rows whose model contains this text")
    args = ap.parse_args(argv)
    runtime = ALL if args.all_parallelisms else None
    print(f"search space: {sorted(runtime)}" if runtime else
          f"search space: each row's program's (Megatron-Core: {sorted(MEGATRON)}; meshplan: {sorted(RUNTIME)})")
    print(f"{'row':<44} {'expert plan':<26} {'meshplan plan':<34} {'ratio':>6} {'solve s':>8}")
    ratios, skipped, below_rows = [], [], []
    with open(args.csv, newline="") as f:
        rows = [(f"line {i}", row, expert_run) for i, row in enumerate(csv.DictReader(f), 2)]
    with open(TORCHTITAN_CSV, newline="") as f:
        rows += [(f"{TORCHTITAN_CSV.name} line {i}", row, torchtitan_run) for i, row in enumerate(csv.DictReader(f), 2)]
    for where, row, build in rows:
        if args.rows not in row["model"]:
            continue
        run = build(row)
        if isinstance(run, str):
            skipped.append(f"{where}: {row['model']}: {run}")
            continue
        expert, ours, ratio, wall, note = compare(run, runtime, args.time_limit)
        ratios.append(ratio)
        if ratio < 1.0 - 1e-9:
            below_rows.append(f"{run.label}: {ratio:.4f}" + (f" ({note})" if note else ""))
        print(f"{run.label:<44} {expert:<26} {ours:<34} {ratio:6.2f} {wall:8.2f}  {note}")
    if ratios:
        print(f"\n{len(ratios)} rows; ratio min {min(ratios):.2f}, geometric mean "
              f"{_geomean(ratios):.2f}; {len(below_rows)} below 1.0" + (":" if below_rows else ""))
    for line in below_rows:
        print(f"  below 1.0: {line}")
    print(f"{len(skipped)} rows not expressed" + (":" if skipped else ""))
    for line in skipped:
        print(f"skipped {line}")
    return 0


def _geomean(xs: list[float]) -> float:
    import math
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
