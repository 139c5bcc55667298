"""From a graph, a cluster and the user's pins to ranked plans.

Phases: enumerate candidates (``space``), cost each with the cost model at three recompute
policies, prune those that cannot fit even with full recomputation, solve the integer program
(``ilp``), re-estimate the winner with its per-layer recompute list, then re-solve with the
winner's strategy excluded to find the runners-up that ``Plan.explain`` shows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..cost_model import Cluster, estimate
from ..ir import Graph, InfeasibleError, Mesh, Plan, PlanError, Prediction, Recompute, SolverInfo
from . import ilp
from .layouts import param_layouts
from .space import Candidate, candidates, check_fixed, explain_empty

GB = 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    graph: Graph
    cluster: Cluster
    model: dict[str, Any]
    global_batch: int
    seq_len: int
    dtype: str = "bfloat16"
    fixed: dict[str, Any] | None = None
    time_limit_s: float = 30.0
    top: int = 5


def _plan_of(req: Request, cand: Candidate, recompute: tuple[Recompute, ...]) -> Plan:
    names = tuple(p.name for p in req.graph.params)
    return Plan(model=req.model, cluster=req.cluster.spec, global_batch=req.global_batch, seq_len=req.seq_len,
                mesh=Mesh(dp=cand.dp, tp=cand.tp), zero_stage=cand.zero, sequence_parallel=cand.sp,
                micro_batch_size=cand.micro_batch, num_microbatches=cand.num_microbatches, recompute=recompute,
                param_layouts=param_layouts(names, tp=cand.tp, zero=cand.zero, dp=cand.dp), dtype=req.dtype)


def _uniform(req: Request, policy: Recompute) -> tuple[Recompute, ...]:
    return (policy,) * req.graph.dims.layers


def cost_candidate(req: Request, cand: Candidate) -> tuple[ilp.CandidateCost, Prediction]:
    """The cost model at no, selective and full recompute, turned into per-layer deltas."""
    layers = req.graph.dims.layers
    p = {r: estimate(req.graph, req.cluster, _plan_of(req, cand, _uniform(req, r))) for r in Recompute}
    none = p[Recompute.NONE]
    extra = tuple(max(0.0, (p[r].step_time_s - none.step_time_s) / layers)
                  for r in (Recompute.SELECTIVE, Recompute.FULL))
    saved = tuple(max(0.0, (none.peak_memory_bytes - p[r].peak_memory_bytes) / layers)
                  for r in (Recompute.SELECTIVE, Recompute.FULL))
    cost = ilp.CandidateCost(time_s=none.step_time_s, memory_bytes=none.peak_memory_bytes, extra_time_s=extra,
                             saved_bytes=saved)
    return cost, none


def _min_memory(cost: ilp.CandidateCost, layers: int) -> float:
    return cost.memory_bytes - layers * max(cost.saved_bytes)


def recompute_list(layers: int, selective: int, full: int) -> tuple[Recompute, ...]:
    """Full recompute on the first layers, then selective, then none (uniform within a pipeline-less plan)."""
    return ((Recompute.FULL,) * full + (Recompute.SELECTIVE,) * selective
            + (Recompute.NONE,) * (layers - full - selective))


def solve(req: Request, *, progress: Callable[[str], None] | None = None) -> tuple[Plan, ...]:
    """The best plan first, then up to ``top - 1`` runners-up of other strategies."""
    say = progress or (lambda _msg: None)
    fixed = check_fixed(req.fixed)
    dims, cl = req.graph.dims, req.cluster
    t0 = time.perf_counter()
    cands = candidates(dims, world=cl.world_size, gpus_per_node=cl.gpus_per_node, global_batch=req.global_batch,
                       seq_len=req.seq_len, fixed=fixed)
    if not cands:
        raise explain_empty(dims, world=cl.world_size, gpus_per_node=cl.gpus_per_node,
                            global_batch=req.global_batch, fixed=fixed)
    costed = [(c, *cost_candidate(req, c)) for c in cands]
    limit = costed[0][2].memory_limit_bytes
    kept = [(c, cost) for c, cost, _ in costed if _min_memory(cost, dims.layers) <= limit]
    t_cost = time.perf_counter() - t0
    say(f"costed {len(cands)} candidates in {t_cost:.2f} s; {len(cands) - len(kept)} cannot fit")
    if not kept:
        raise infeasible(req, costed, limit)
    problem = ilp.Problem(costs=tuple(cost for _, cost in kept), layers=dims.layers, memory_limit_bytes=limit,
                          pinned_recompute=fixed.get("recompute"))
    plans = []
    budget = req.time_limit_s
    while len(plans) < max(1, req.top) and budget > 0:
        sol = ilp.solve(problem, time_limit_s=budget)
        budget -= sol.wall_s
        if sol.candidate < 0:
            if not plans:
                raise infeasible(req, costed, limit, status=sol.status)
            break
        cand = kept[sol.candidate][0]
        plans.append((cand, sol))
        group = {i for i, (c, _) in enumerate(kept) if c.group == cand.group}
        problem = replace(problem, excluded=problem.excluded | group)
        say(f"solution {len(plans)}: {cand.describe()} ({sol.status}, {sol.wall_s:.2f} s)")
    return _finish(req, plans, n_candidates=len(cands), n_pruned=len(cands) - len(kept), t_cost=t_cost,
                   all_pinned=_all_pinned(fixed))


def _fit(req: Request, cand: Candidate, selective: int, full: int) -> Plan:
    """The plan with the ILP's recompute counts, re-estimated by the cost model. The ILP's per-layer
    deltas are linear; where the cost model is not exactly additive the estimate can land a little over
    the limit, so recompute more layers (selective to full first) until it fits or nothing is left."""
    layers = req.graph.dims.layers
    while True:
        plan = _plan_of(req, cand, recompute_list(layers, selective, full))
        plan = plan.with_prediction(estimate(req.graph, req.cluster, plan))
        pred = plan.prediction
        pinned = (req.fixed or {}).get("recompute")
        if pred.peak_memory_bytes <= pred.memory_limit_bytes or full == layers or pinned:
            return plan
        if selective:
            selective, full = selective - 1, full + 1
        else:
            full += 1


def _all_pinned(fixed: dict[str, Any]) -> bool:
    return {"tp", "dp", "zero", "micro_batch", "recompute"} <= set(fixed)


def _finish(req: Request, found: list, *, n_candidates: int, n_pruned: int, t_cost: float,
            all_pinned: bool) -> tuple[Plan, ...]:
    layers = req.graph.dims.layers
    plans = []
    for cand, sol in found:
        plans.append(_fit(req, cand, *sol.recompute_layers))
    best_cand, best_sol = found[0]
    alternatives = tuple(_alternative(plans[0], p) for p in plans[1:])
    info = SolverInfo(status="EVALUATED" if all_pinned else best_sol.status,
                      wall_s=t_cost + sum(s.wall_s for _, s in found), gap=best_sol.gap,
                      candidates=n_candidates, pruned=n_pruned, variables=best_sol.variables,
                      constraints=best_sol.constraints, binding=binding(plans[0]), alternatives=alternatives)
    return tuple(replace(p, solver=info if i == 0 else None) for i, p in enumerate(plans))


def binding(plan: Plan) -> str:
    pred = plan.prediction
    used, limit = pred.peak_memory_bytes, pred.memory_limit_bytes
    recomputed = sum(r != Recompute.NONE for r in plan.recompute)
    if recomputed:
        return (f"memory: {used / GB:.1f} of {limit / GB:.1f} GB per GPU even with {recomputed} of "
                f"{len(plan.recompute)} layers recomputed")
    if used > 0.9 * limit:
        return f"memory: {used / GB:.1f} of {limit / GB:.1f} GB per GPU"
    return f"none: the fastest strategy fits with {(limit - used) / GB:.1f} GB per GPU to spare"


def _alternative(best: Plan, other: Plan) -> dict[str, Any]:
    b, o = best.prediction, other.prediction
    slower = o.step_time_s / b.step_time_s - 1
    deltas = {k: o.time_s[k] - b.time_s.get(k, 0.0) for k in o.time_s}
    worst = max(deltas, key=deltas.get)
    why = (f"{slower:.1%} slower: {worst.replace('_', ' ')} {deltas[worst] * 1e3:+.1f} ms per step"
           if slower > 0 else "equal predicted time; ranked lower by the tie-break")
    return {"summary": other.summary(), "step_time_s": o.step_time_s, "peak_memory_bytes": o.peak_memory_bytes,
            "why": why}


def infeasible(req: Request, costed: list, limit: float, status: str = "") -> InfeasibleError:
    """Name the memory the least hungry strategy needs against what a GPU has, and a GPU count that fits."""
    layers = req.graph.dims.layers
    cand, cost, _ = min(costed, key=lambda x: _min_memory(x[1], layers))
    need = _min_memory(cost, layers)
    gpus = gpus_that_fit(req)
    name = req.graph.dims.family if not req.model.get("name") else req.model["name"]
    hint = f"use at least {gpus} GPUs" if gpus else "no cluster of this kind up to 4096 nodes fits it"
    return InfeasibleError(
        f"{name} needs {need / GB:.1f} GB per GPU at best ({cand.describe()}, full recompute) but a "
        f"{req.cluster.accelerator.name} has {limit / GB:.1f} GB usable on {req.cluster.spec}; {hint}, "
        "or a smaller global batch or sequence")


def gpus_that_fit(req: Request) -> int:
    """The smallest whole number of nodes (doubling) on which some candidate fits in memory."""
    nodes = req.cluster.nodes * 2
    while nodes <= 4096:
        try:
            bigger = Cluster.preset(req.cluster.name, nodes=nodes, gpus_per_node=req.cluster.gpus_per_node)
        except PlanError:
            return 0  # not a preset: no way to say what a bigger one would be
        fixed = {k: v for k, v in (req.fixed or {}).items() if k not in ("dp", "tp", "micro_batch", "num_microbatches")}
        world = bigger.world_size
        batch = world * -(-req.global_batch // world)  # divisible by every dp that divides the world
        sub = replace(req, cluster=bigger, global_batch=batch, fixed=fixed)
        cands = candidates(req.graph.dims, world=bigger.world_size, gpus_per_node=bigger.gpus_per_node,
                           global_batch=batch, seq_len=req.seq_len, fixed=fixed)
        smallest = [c for c in cands if c.micro_batch == 1 and c.zero == 3]
        for cand in smallest:
            cost, pred = cost_candidate(sub, cand)
            if _min_memory(cost, req.graph.dims.layers) <= pred.memory_limit_bytes:
                return bigger.world_size
        nodes *= 2
    return 0
