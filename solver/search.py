"""From a graph, a cluster and the user's pins to ranked plans.

Phases, each timed into the plan's solver statistics:

1. enumerate the candidates (``space.py``) and time each with the cost model without
   recomputation (``cost_model.step_time``: the step alone, no memory): a lower bound on its objective;
2. take a window of the cheapest; price each one's memory without and with selective and full recomputation
   (and offloading) and drop those that cannot fit even so (``memory_floor``: the memory alone, no step timed);
   time the rest under the same policies, and solve the integer program (``ilp.py``) on them; grow
   the window until the optimum inside it is no worse than the bound of the first candidate left
   out, which proves it optimal over all candidates;
3. re-estimate the winner with its per-layer recompute list, then re-solve with the winner's
   strategy excluded for the runners-up that ``Plan.explain`` shows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable

from ..cost_model import (DEFAULT_SOFTWARE, Cluster, Software, estimate, host_offload_layers, memory_breakdown,
                          step_time)
from ..cost_model.summary import summary_of
from ..ir import Graph, Mesh, ModelStructure, Plan, PlanError, Recompute, SolverInfo, limits
from . import ilp, intra_op
from .infeasible import infeasible
from .layouts import param_layouts, structure_split
from .pins import check_pins_fit
from .space import (OFFLOAD, OFFLOAD_WITH_PP, OFFLOAD_WITH_RECOMPUTE, OFFLOAD_WITH_TP, RUNTIME, Candidate, candidates,
                    check_fixed, explain_empty, scale_up_gpus)
from .stages import stage_ranges

WINDOW = 64


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
    runtime: frozenset[str] = RUNTIME  # what the runtime executes: the search offers nothing else
    software: Software = DEFAULT_SOFTWARE  # the program every candidate is costed as (cost_model.software)


def plan_of(req: Request, cand: Candidate, selective: int = 0, full: int = 0, offload: int = 0, *,
            layouts: bool = False) -> Plan:
    """The plan of a candidate with ``full``, then ``offload``, then ``selective`` layers on every pipeline rank.
    Parameter layouts (one entry per parameter) are only worked out for the plans returned."""
    dims = req.graph.dims
    stages = stage_ranges(dims, cand.pp, cand.vp)
    names = tuple(p.name for p in req.graph.params) if layouts else ()
    return Plan(model=req.model, cluster=req.cluster.spec, global_batch=req.global_batch, seq_len=req.seq_len,
                mesh=Mesh(pp=cand.pp, dp=cand.dp, cp=cand.cp, tp=cand.tp, ep=cand.ep, fold_ep=cand.fold_ep),
                zero_stage=cand.zero,
                zero_group=cand.zero_group, sequence_parallel=cand.sp, micro_batch_size=cand.micro_batch, num_microbatches=cand.num_microbatches,
                schedule=cand.schedule, vp=cand.vp, stages=stages,
                recompute=recompute_list(dims.layers, stages, cand.pp, selective, full, offload),
                param_layouts=param_layouts(names, tp=cand.tp, zero=cand.zero, dp=cand.dp,
                                            tp_layouts=_tp_layouts(req, cand) if layouts else None), dtype=req.dtype,
                software=req.software.name, structure=_structure_dict(req.graph.structure))


@lru_cache(maxsize=16)
def _structure_dict(structure: ModelStructure | None) -> dict[str, Any]:
    """One dict per model for every candidate: the cost model prices the sublayers its structure keeps whole over tp
    (``cost_model.sublayers``)."""
    return structure.to_dict() if structure is not None else {}


TP_REPLICATE = "tp_replicate"  # a replicated sublayer inside a tp block (codegen/tp_plans runs it plain)
SP_WHOLE_ATTN = "sp_whole_attn"  # ... the attention too, under sequence parallelism (space.py)


def intra_op_of(req: Request, cand: Candidate) -> intra_op.GraphSolution | None:
    """The intra-op program's answer for the candidate's tp degree (cached), None without tp."""
    if cand.tp == 1 or not req.graph.blocks:
        return None
    structure = req.graph.structure
    split = ((structure.attn,) if SP_WHOLE_ATTN not in req.runtime and structure is not None and structure.attn
             else ())
    whole = _kept_whole(structure)
    return intra_op.solve_graph(req.graph, tp=cand.tp, cluster=req.cluster, micro_batch=cand.micro_batch,
                                seq_len=req.seq_len // cand.cp, sp=cand.sp, dtype=req.dtype,
                                replicate=TP_REPLICATE in req.runtime, split_under_sp=split, keep_whole=whole)


def _kept_whole(structure: ModelStructure | None) -> tuple[str, ...]:
    """The block sublayers the runtime keeps whole over tp (``ModelStructure.tp_linears``: an attention a head split
    would change, a fused q/k/v or gate-and-up projection, GPT-2's Conv1D), which the intra-op program may only
    replicate; not a MoE's experts (expert parallelism splits those)."""
    if structure is None:
        return ()
    return tuple(getattr(structure, sub) for sub, linears in structure.tp_linears().items()
                 if linears is None and getattr(structure, sub) and not (sub == "mlp" and structure.experts))


def _tp_layouts(req: Request, cand: Candidate) -> dict[str, str] | None:
    """The intra-op program's tp placements, or, where it finds none, Megatron's split on the model's own paths."""
    sol = intra_op_of(req, cand)
    if sol is None:
        return None
    return sol.tp_placements(req.graph) if sol.ok else (structure_split(req.graph) or None)


def recompute_list(layers: int, stages: tuple[tuple[int, int], ...], pp: int, selective: int,
                   full: int, offload: int = 0) -> tuple[Recompute, ...]:
    """Per layer: on each pipeline rank, its first ``full`` layers recompute fully, the next ``offload``
    keep their activations in host memory (the first layers, as Megatron's --cpu-offloading-num-layers
    offloads), the next ``selective`` recompute selectively (walking the rank's chunks in order), the rest
    not at all."""
    if not (full or offload or selective):
        return (Recompute.NONE,) * layers
    out = [Recompute.NONE] * layers
    seen = [0] * pp  # layers of each rank walked so far: one pass over the layers, not one per rank
    for c, (a, b) in enumerate(stages or ((0, layers),)):
        for i in range(a, b):
            j = seen[c % pp]
            seen[c % pp] += 1
            out[i] = (Recompute.FULL if j < full else Recompute.OFFLOAD if j < full + offload
                      else Recompute.SELECTIVE if j < full + offload + selective else Recompute.NONE)
    return tuple(out)


def layers_per_rank(stages: tuple[tuple[int, int], ...], pp: int, layers: int) -> int:
    if not stages:
        return layers
    per_rank = [0] * pp
    for c, (a, b) in enumerate(stages):
        per_rank[c % pp] += b - a
    return max(per_rank)


def offers_offload(req: Request) -> bool:
    """Whether the search may keep layers' activations in host memory: the program runs it and the GPU has
    a host link to send them over (``Accelerator.host_link_Bps``; a CPU rank's are in host memory already)."""
    return OFFLOAD in req.runtime and req.cluster.accelerator.host_link_Bps > 0


@dataclass(frozen=True, slots=True)
class Peaks:
    """A candidate's peak memory per GPU without recomputation and under each policy the program offers it, on every
    layer of the most loaded pipeline rank (``per_rank``); ``cap``: the most layers a rank may offload."""
    per_rank: int
    cap: int | None
    none: float
    ends: dict[str, float]


def candidate_peaks(req: Request, cand: Candidate) -> Peaks:
    per_rank = layers_per_rank(stage_ranges(req.graph.dims, cand.pp, cand.vp), cand.pp, req.graph.dims.layers)
    offload = (offers_offload(req) and (cand.tp == 1 or OFFLOAD_WITH_TP in req.runtime)
               and (cand.pp == 1 or OFFLOAD_WITH_PP in req.runtime))
    policies = ilp.POLICIES if offload else ilp.POLICIES[:2]
    peak = lambda **layers: sum(memory_breakdown(  # noqa: E731
        req.graph, req.cluster, plan_of(req, cand, **layers), software=req.software).values())
    return Peaks(per_rank=per_rank, cap=_offload_cap(req, cand) if offload else None, none=peak(),
                 ends={r: peak(**{r: per_rank}) for r in policies})


def _candidate_cost(req: Request, peaks: Peaks, none_s: float, ends_s: dict[str, float]) -> ilp.CandidateCost:
    """The program's entry for a candidate: per layer, the deltas of a uniform policy; offloading's from as many
    layers as the host memory holds."""
    per_rank, cap = peaks.per_rank, peaks.cap
    done = {r: min(per_rank, cap) if r == "offload" and cap is not None else per_rank for r in peaks.ends}
    extra = tuple(max(0.0, (ends_s[r] - none_s) / max(done[r], 1)) for r in peaks.ends)
    saved = tuple(max(0.0, (peaks.none - peaks.ends[r]) / max(done[r], 1)) for r in peaks.ends)
    return ilp.CandidateCost(time_s=none_s, memory_bytes=peaks.none, extra_time_s=extra, saved_bytes=saved,
                             layers=per_rank, offload_alone=OFFLOAD_WITH_RECOMPUTE not in req.runtime, offload_cap=cap)


def cost_candidate(req: Request, cand: Candidate, peaks: Peaks | None = None) -> ilp.CandidateCost:
    """Per-layer deltas of selective and full recomputation (and offloading, where offered), from the cost
    model at uniform policies: the memory (``peaks``, computed where not given), then the step."""
    peaks = peaks or candidate_peaks(req, cand)
    step = lambda **layers: step_time(req.graph, req.cluster, plan_of(req, cand, **layers),  # noqa: E731
                                      software=req.software)
    return _candidate_cost(req, peaks, step(), {r: step(**{r: peaks.per_rank}) for r in peaks.ends})


def memory_floor(req: Request, cand: Candidate, recompute: str | None = None, peaks: Peaks | None = None) -> float:
    """``min_memory`` of the candidate's cost from its memory alone (no step timed): the window times only the
    candidates that can fit, a quarter of the work for each of the many that cannot (most of them, where the
    model is large for the cluster)."""
    peaks = peaks or candidate_peaks(req, cand)
    return min_memory(_candidate_cost(req, peaks, 0.0, dict.fromkeys(peaks.ends, 0.0)), recompute)


def _offload_cap(req: Request, cand: Candidate) -> int | None:
    """The layers a rank of ``cand`` may offload: what the first pipeline rank's share of host memory holds
    (it has the most micro-batches in flight); None where the host memory is not known."""
    plan = plan_of(req, cand)
    return host_offload_layers(summary_of(req.graph), req.cluster, plan, 0, req.software)


def min_memory(cost: ilp.CandidateCost, recompute: str | None = None) -> float:
    """The least memory per GPU the candidate can reach: with the recompute policy the user pinned (every
    layer under it; ``inf`` where the candidate does not offer it), else with the one that saves the most."""
    if recompute == "none":
        return cost.memory_bytes
    offered = dict(zip(ilp.POLICIES, cost.saved_bytes))
    if recompute is not None and recompute not in offered:
        return float("inf")
    policies = [recompute] if recompute is not None else list(offered)
    return cost.memory_bytes - max(ilp.most_layers(cost, r) * offered[r] for r in policies)


@dataclass(slots=True)
class _Search:
    """What the phases share: the candidates by bound, the costed window, the clock."""
    req: Request
    cands: list[Candidate]
    bounds: list[float]  # each candidate's step without recomputation (``step_time``), ascending
    floors: dict[int, float]  # the least memory each candidate the window reached can take (``memory_floor``)
    costs: dict[int, ilp.CandidateCost]  # those of them that can fit, costed in full
    limit: float
    start: float
    phases: dict[str, float] = field(default_factory=dict)

    def lap(self, name: str) -> None:
        """Record the wall time since the previous phase ended as ``name``'s."""
        self.phases[name] = time.perf_counter() - self.start - sum(self.phases.values())


def solve(req: Request, *, progress: Callable[[str], None] | None = None) -> tuple[Plan, ...]:
    """The best plan first, then up to ``top - 1`` runners-up of other strategies."""
    say = progress or (lambda _msg: None)
    fixed = check_request(req)
    req = replace(req, fixed=fixed)
    start = time.perf_counter()
    s = _bounded(req, start)
    s.lap("enumerate + bound")
    say(f"{len(s.cands)} candidates costed in {time.perf_counter() - start:.2f} s")
    window, problem, sol = _solve_window(s, fixed, say)
    best, sol, fitted = _fastest_fitted(s, window, problem, sol)
    s.lap("window + ILP")
    found = [(best, sol)]
    problem = _exclude(problem, window, best)
    while len(found) < max(1, req.top) and req.time_limit_s - (time.perf_counter() - start) > 0:
        nxt = ilp.solve(problem, time_limit_s=req.time_limit_s - (time.perf_counter() - start))
        if nxt.candidate < 0:
            break
        found.append((window[nxt.candidate], nxt))
        problem = _exclude(problem, window, window[nxt.candidate])
    s.lap("runners-up")
    say(f"solved in {time.perf_counter() - start:.2f} s: {found[0][0].describe()} ({sol.status})")
    return _finish(s, found, fixed, fitted)


def check_request(req: Request) -> dict[str, Any]:
    """Sizes within ``ir/limits.py`` (so every loop below is bounded), then the pins alone and against
    the model and cluster, each refused with its own rule; returns the normalized pins."""
    dims, cl = req.graph.dims, req.cluster
    limits.check_sizes(global_batch=req.global_batch, seq_len=req.seq_len, world=cl.world_size, layers=dims.layers)
    limits.check_time_limit("time_limit_s", req.time_limit_s)
    fixed = check_fixed(req.fixed, req.runtime)
    if fixed.get("recompute") == OFFLOAD and not offers_offload(req):
        raise PlanError(f"fixed: recompute=offload, but {req.cluster.accelerator.name} has no host link to offload "
                        "over (host_link_Bps 0: a CPU rank's activations are in host memory already); pin none, "
                        "selective or full, or give the cluster file's accelerator a host_link_Bps")
    check_pins_fit(dims, world=cl.world_size, domain=scale_up_gpus(cl), global_batch=req.global_batch,
                   seq_len=req.seq_len, fixed=fixed, runtime=req.runtime,
                   model_name=req.model.get("name") or dims.family)
    return fixed


def _bounded(req: Request, start: float) -> _Search:
    dims, cl = req.graph.dims, req.cluster
    cands = candidates(dims, world=cl.world_size, domain=scale_up_gpus(cl), global_batch=req.global_batch,
                       seq_len=req.seq_len, fixed=req.fixed, runtime=req.runtime)
    if not cands:
        raise explain_empty(dims, world=cl.world_size, domain=scale_up_gpus(cl),
                            global_batch=req.global_batch, fixed=req.fixed)
    # ordered by the step alone: the memory and the rest of the prediction only for the candidates the window
    # costs (``_solve_window``), a third of the work of each of the many it never reaches
    steps = [step_time(req.graph, cl, plan_of(req, c), software=req.software) for c in cands]
    order = sorted(range(len(cands)), key=lambda i: (steps[i], i))
    return _Search(req=req, cands=[cands[i] for i in order], bounds=[steps[i] for i in order], floors={}, costs={},
                   limit=cl.accelerator.usable_memory_bytes, start=start)  # every prediction's memory_limit_bytes


def _first_that_fits(s: _Search, kept: list[int], pinned: str | None, bound_out: float):
    """When time ran out before the program found a plan: the first candidate in bound order whose own
    program (one candidate: its recompute counts alone) has a solution, reported FEASIBLE with the lower
    bound of every candidate still in the race, so the gap says how far from proven it is."""
    bound = min(s.bounds[kept[0]], bound_out)
    for i in kept:
        one = ilp.Problem(costs=(s.costs[i],), memory_limit_bytes=s.limit, pinned_recompute=pinned)
        sol = ilp.solve(one, time_limit_s=5.0)
        if sol.candidate >= 0:
            return [s.cands[i]], one, replace(sol, status="FEASIBLE", bound_s=min(bound, sol.objective_s))
    raise infeasible(s.req, s.cands, s.floors, s.limit, pinned)


def _solve_window(s: _Search, fixed: dict, say: Callable[[str], None]):
    size, pinned = WINDOW, fixed.get("recompute")
    while True:
        for i in range(len(s.floors), min(size, len(s.cands))):
            peaks = candidate_peaks(s.req, s.cands[i])
            s.floors[i] = memory_floor(s.req, s.cands[i], pinned, peaks)
            if s.floors[i] <= s.limit:
                s.costs[i] = cost_candidate(s.req, s.cands[i], peaks)
        kept = [i for i in range(min(size, len(s.cands))) if i in s.costs]
        kept = _within_reach(s, kept, pinned)
        if kept:
            problem = ilp.Problem(costs=tuple(s.costs[i] for i in kept), memory_limit_bytes=s.limit,
                                  pinned_recompute=pinned)
            left = s.req.time_limit_s - (time.perf_counter() - s.start)
            sol = ilp.solve(problem, time_limit_s=max(left, 0.5))
            bound_out = s.bounds[size] if size < len(s.cands) else float("inf")
            if sol.candidate >= 0 and (sol.objective_s <= bound_out or left <= 0):
                if sol.objective_s > bound_out:
                    sol = replace(sol, status="FEASIBLE", bound_s=min(sol.bound_s, bound_out))
                return [s.cands[i] for i in kept], problem, sol
            if sol.candidate < 0 and left <= 0:  # out of time before the program found any plan
                return _first_that_fits(s, kept, pinned, bound_out)
        if size >= len(s.cands):
            raise infeasible(s.req, s.cands, s.floors, s.limit, pinned)
        size *= 2
        say(f"window grows to {min(size, len(s.cands))} candidates")


def _within_reach(s: _Search, kept: list[int], pinned: str | None) -> list[int]:
    """The candidates of ``kept`` that can still be among the answers: the best plan, the ``REFITS`` tried after it
    and the runners-up of ``req.top`` other strategies. A candidate whose objective's lower bound exceeds the
    upper bound of the (top + REFITS + 1)-th best strategy cannot be (``ilp.value_bounds``), so the program
    need not hold it: the optimum is the same, and the program small where most candidates need recomputation."""
    bounds = {i: ilp.value_bounds(s.costs[i], s.limit, pinned) for i in kept}
    best_of_group: dict[object, float] = {}
    for i in kept:
        group = s.cands[i].group
        best_of_group[group] = min(best_of_group.get(group, float("inf")), bounds[i][1])
    uppers = sorted(best_of_group.values())
    reach = uppers[min(len(uppers), max(1, s.req.top) + REFITS + 1) - 1] if uppers else float("inf")
    return [i for i in kept if bounds[i][0] <= reach * (1 + 1e-9)]


REFITS = 8  # at most this many more candidates fitted when the ILP's choice fits slower than its objective said


def _fastest_fitted(s: _Search, window: list[Candidate], problem: ilp.Problem,
                    sol: ilp.Solution) -> tuple[Candidate, ilp.Solution, Plan]:
    """The candidate whose fitted plan is fastest, its solution and that plan. The ILP prices recomputation with
    per-layer deltas that add up linearly; ``_fit`` re-estimates the chosen plan exactly and recomputes more
    layers until it fits, so the plan can come out slower than the objective said, and slower than a
    candidate the ILP ranked second. Every candidate's objective under-states its fitted time the same way,
    so candidates are fitted in objective order (each ILP re-solved without the ones tried) until the next
    objective is no faster than the fastest fitted plan, or ``REFITS`` more have been tried."""
    cand = window[sol.candidate]
    best = (cand, sol, _fit(s.req, cand, cost_layers(s, cand), *sol.recompute_layers))
    tried = replace(problem, excluded=problem.excluded | {sol.candidate})
    for _ in range(REFITS):
        best_s = best[2].prediction.step_time_s
        left = s.req.time_limit_s - (time.perf_counter() - s.start)
        if best_s <= sol.objective_s or left <= 0:
            break
        nxt = ilp.solve(tried, time_limit_s=left)
        if nxt.candidate < 0 or nxt.objective_s >= best_s:
            break
        other = window[nxt.candidate]
        plan = _fit(s.req, other, cost_layers(s, other), *nxt.recompute_layers)
        if _fits(s.req, plan) and plan.prediction.step_time_s < best_s:
            best = (other, nxt, plan)
        tried = replace(tried, excluded=tried.excluded | {nxt.candidate})
    return best


def _exclude(problem: ilp.Problem, window: list[Candidate], cand: Candidate) -> ilp.Problem:
    group = {i for i, c in enumerate(window) if c.group == cand.group}
    return replace(problem, excluded=problem.excluded | group)


def _fit(req: Request, cand: Candidate, per_rank: int, selective: int, full: int, offload: int = 0) -> Plan:
    """The plan with the program's recompute counts, re-estimated by the cost model. The program's
    per-layer deltas are linear; where the cost model is not exactly additive the estimate can land
    a little over the limit, so recompute more layers (selective to full first, then the layers kept by
    none) until it fits; with every layer recomputed or offloaded, offload the recomputed ones where the
    program offloads (an offloaded layer keeps nothing on the GPU, a recomputed one its input). A program
    that offloads only without recomputation (Megatron-Core) offloads more layers instead, up to all but one."""
    alone = OFFLOAD_WITH_RECOMPUTE not in req.runtime
    cap = _offload_cap(req, cand) if offload else None
    room = per_rank if cap is None else min(per_rank, cap + 1)  # offload + 1 < room: one more still fits the host
    while True:
        plan = plan_of(req, cand, selective, full, offload, layouts=True)
        plan = plan.with_prediction(estimate(req.graph, req.cluster, plan, software=req.software))
        if _fits(req, plan):
            return plan
        if offload and alone:
            if offload + 1 >= room:
                return plan
            offload += 1
        elif selective:
            selective, full = selective - 1, full + 1
        elif full + offload < per_rank:
            full += 1
        elif offload and full and offload + 1 < room:
            full, offload = full - 1, offload + 1
        else:
            return plan


def _fits(req: Request, plan: Plan) -> bool:
    """Whether a fitted plan is done: it fits in memory, or its recomputation was pinned (nothing left to add)."""
    pred = plan.prediction
    return pred.peak_memory_bytes <= pred.memory_limit_bytes or bool(req.fixed.get("recompute"))


def _finish(s: _Search, found: list, fixed: dict, fitted: Plan) -> tuple[Plan, ...]:
    """``fitted``: the first candidate's plan, already fitted (``_fastest_fitted``)."""
    plans = [fitted] + [_fit(s.req, cand, cost_layers(s, cand), *sol.recompute_layers) for cand, sol in found[1:]]
    s.lap("fit + layouts")
    best_sol = found[0][1]
    evaluated = {"tp", "dp", "zero", "micro_batch", "recompute"} <= set(fixed)
    info = SolverInfo(status="EVALUATED" if evaluated else best_sol.status,
                      wall_s=time.perf_counter() - s.start, gap=best_sol.gap, candidates=len(s.cands),
                      pruned=len(s.cands) - len(s.costs),
                      variables=best_sol.variables, constraints=best_sol.constraints, binding=binding(plans[0]),
                      **_intra_op_info(s.req, found[0][0]),
                      alternatives=tuple(_alternative(plans[0], p) for p in plans[1:]), phases=dict(s.phases))
    return tuple(replace(p, solver=info if i == 0 else None) for i, p in enumerate(plans))


def _intra_op_info(req: Request, cand: Candidate) -> dict[str, Any]:
    sol = intra_op_of(req, cand)
    if sol is None:
        return {}
    line = f"tp={cand.tp}{', sp' if cand.sp else ''}: " + (sol.summary() if sol.ok else "no executable layout; "
                                                          "Megatron's rules (solver/layouts.py) used")
    return {"intra_op": line, "intra_op_variables": sol.variables, "intra_op_constraints": sol.constraints}


def cost_layers(s: _Search, cand: Candidate) -> int:
    return layers_per_rank(stage_ranges(s.req.graph.dims, cand.pp, cand.vp), cand.pp, s.req.graph.dims.layers)


GB = 1e9


def binding(plan: Plan) -> str:
    pred = plan.prediction
    used, limit = pred.peak_memory_bytes, pred.memory_limit_bytes
    recomputed = sum(r not in (Recompute.NONE, Recompute.OFFLOAD) for r in plan.recompute)
    offloaded = plan.recompute.count(Recompute.OFFLOAD)
    if recomputed or offloaded:
        kept = " and ".join(([f"{recomputed} recomputed"] if recomputed else [])
                            + ([f"{offloaded} offloaded to host memory"] if offloaded else []))
        return (f"memory: {used / GB:.1f} of {limit / GB:.1f} GB per GPU even with {kept} of "
                f"{len(plan.recompute)} layers")
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
