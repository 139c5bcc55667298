r"""The integer program that picks the strategy, solved with OR-Tools CP-SAT.

Data, per candidate ``c`` (a mesh, ZeRO stage, sequence parallelism and micro-batching, see
``space.py``), read off the cost model:

    t_c       step time with no recomputation                        (µs)
    m_c       peak memory per GPU with no recomputation              (KiB)
    dt_c^r    extra step time per layer recomputed with policy r     (µs),  r ∈ {sel, full, offload}
    dm_c^r    memory saved per layer recomputed with policy r        (KiB)
    L_c       layers per pipeline rank (the most loaded);   M  memory per GPU

Variables:

    y_c ∈ {0, 1}            candidate c is chosen
    k_c^r ∈ {0, …, L_c}     layers of each pipeline rank of candidate c recomputed with policy r
                            (0 where the candidate does not offer r: offloading needs a host link and a
                            program that runs it; ``CandidateCost`` lists the policies it offers)

Constraints:

    Σ_c y_c = 1                                            (add_choose_one)
    Σ_r k_c^r ≤ L_c · y_c                                   (add_layer_budget)
    k_c^off ≤ (L_c − 1)·z_c,  k_c^sel + k_c^full ≤ L_c·(1 − z_c)  where offloading stands alone (Megatron)
    m_c·y_c − Σ_r dm_c^r·k_c^r ≤ M·y_c                      (add_memory_limit)
    k_c^r = L_c·y_c   where the user pinned recompute = r    (add_pinned_recompute; offload alone: L_c − 1)

Objective (add_objective):

    min Σ_c ( t_c·y_c + Σ_r dt_c^r·k_c^r )

Every pipeline rank recomputes the same number of its layers, so the most loaded rank's memory
and the slowest rank's time (which sets the pipeline's pace) move linearly with ``k``: the program
is exact for the cost model up to that linearity. The chosen plan is re-estimated by the cost
model with its actual per-layer recompute list (and more layers recomputed if the estimate lands
over the limit), and that estimate is what the plan reports. Costs are scaled to integers (µs and
KiB) because CP-SAT works on integers.

Only a window of candidates enters the program: they are sorted by their time without
recomputation ``t_c``, a lower bound on their objective, and the window grows until the optimum
inside it is no worse than the bound of the first candidate left out (``search.py``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

POLICIES = ("selective", "full", "offload")  # "offload": the layer's activations kept in host memory
TIME_SCALE = 1e6  # seconds -> µs
MEMORY_SCALE = 1 / 1024  # bytes -> KiB
ROUNDING_BYTES = 16 * 1024  # more than the program's rounding of a candidate's memory terms to KiB can move them


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateCost:
    time_s: float
    memory_bytes: float
    extra_time_s: tuple[float, ...]  # per layer under each policy offered, in POLICIES' order (a prefix of it)
    saved_bytes: tuple[float, ...]  # the same, memory saved
    layers: int  # layers on the most loaded pipeline rank
    # the program offloads only without recomputation and keeps at least one layer on the GPU (Megatron-Core)
    offload_alone: bool = False
    # the most layers a rank may offload: what its share of host memory holds (cost_model.host_offload_layers);
    # None: not bounded (the host memory is not known)
    offload_cap: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    costs: tuple[CandidateCost, ...]
    memory_limit_bytes: float
    pinned_recompute: str | None = None  # "none" | "selective" | "full" | "offload" | None
    excluded: frozenset[int] = frozenset()  # candidates already returned (for the runners-up)


@dataclass(frozen=True, slots=True, kw_only=True)
class Solution:
    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN
    candidate: int  # -1 when none
    recompute_layers: tuple[int, ...]  # per policy the chosen candidate offers: selective, full(, offload)
    objective_s: float
    bound_s: float
    wall_s: float
    variables: int
    constraints: int

    @property
    def gap(self) -> float:
        if self.candidate < 0 or self.objective_s <= 0:
            return 0.0
        return max(0.0, (self.objective_s - self.bound_s) / self.objective_s)


@dataclass(slots=True)
class _Vars:
    y: list
    k: list  # k[c][r]


def _int(x: float) -> int:
    return int(round(x))


def add_variables(model: cp_model.CpModel, p: Problem) -> _Vars:
    y = [model.new_bool_var(f"y{c}") for c in range(len(p.costs))]
    k = [[model.new_int_var(0, cost.layers if r < len(cost.extra_time_s) else 0, f"k{c}_{r}")
          for r in range(len(POLICIES))] for c, cost in enumerate(p.costs)]
    return _Vars(y=y, k=k)


def add_choose_one(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    model.add_exactly_one(v.y)
    for c in p.excluded:
        model.add(v.y[c] == 0)


def add_layer_budget(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    for c, cost in enumerate(p.costs):
        model.add(sum(v.k[c]) <= cost.layers * v.y[c])
        if cost.offload_cap is not None and len(cost.extra_time_s) == len(POLICIES):
            model.add(v.k[c][2] <= cost.offload_cap * v.y[c])
        if cost.offload_alone and len(cost.extra_time_s) == len(POLICIES):
            alone = model.new_bool_var(f"z{c}")
            model.add(v.k[c][2] <= (cost.layers - 1) * alone)
            model.add(v.k[c][0] + v.k[c][1] <= cost.layers - cost.layers * alone)


def add_memory_limit(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    limit = _int(p.memory_limit_bytes * MEMORY_SCALE)
    for c, cost in enumerate(p.costs):
        saved = sum(_int(cost.saved_bytes[r] * MEMORY_SCALE) * v.k[c][r] for r in range(len(cost.saved_bytes)))
        model.add(_int(cost.memory_bytes * MEMORY_SCALE) * v.y[c] - saved <= limit * v.y[c])


def add_pinned_recompute(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    if p.pinned_recompute is None:
        return
    for c, cost in enumerate(p.costs):
        for r, policy in enumerate(POLICIES):
            if policy == p.pinned_recompute:
                model.add(v.k[c][r] == most_layers(cost, policy) * v.y[c])
            else:
                model.add(v.k[c][r] == 0)


def most_layers(cost: CandidateCost, policy: str) -> int:
    """The most layers of a rank ``policy`` may take: all, or for offloading all but one where the program
    offloads alone (Megatron-Core), and no more than the host memory holds (``offload_cap``)."""
    if policy != "offload":
        return cost.layers
    most = cost.layers - 1 if cost.offload_alone else cost.layers
    return most if cost.offload_cap is None else min(most, cost.offload_cap)


def value_bounds(cost: CandidateCost, limit_bytes: float, pinned: str | None = None) -> tuple[float, float]:
    """(lower, upper) bounds on the candidate's objective in this program, without solving it: the lower bound
    from the linear relaxation's cheapest rate (every byte above the limit saved at the best seconds per byte
    any policy offers), the upper bound from a solution that fits (no recomputation, one policy alone, or
    selective and full filled by that rate); ``inf`` where none is found. Each allows ``ROUNDING_BYTES`` for the
    program's rounding to KiB. The window drops a candidate whose lower bound exceeds others' upper bounds
    (``search._within_reach``): it cannot be the program's answer."""
    excess = cost.memory_bytes - limit_bytes
    low, high = excess - ROUNDING_BYTES, excess + ROUNDING_BYTES  # the excess at its least and at its most
    offered = range(len(cost.saved_bytes))
    if pinned is not None:  # every layer under the pinned policy: the objective is known
        r = POLICIES.index(pinned) if pinned in POLICIES else None
        if r is not None and r not in offered:
            return float("inf"), float("inf")
        k = most_layers(cost, pinned) if r is not None else 0
        saved = k * cost.saved_bytes[r] if r is not None else 0.0
        value = cost.time_s + (k * cost.extra_time_s[r] if r is not None else 0.0)
        return (value if low <= saved else float("inf")), (value if high <= saved else float("inf"))
    rates = [(cost.extra_time_s[r] / cost.saved_bytes[r], r) for r in offered if cost.saved_bytes[r] > 0]
    lower = cost.time_s if low <= 0 else cost.time_s + low * min(rates)[0] if rates else float("inf")
    if high <= 0:
        return lower, cost.time_s
    upper = float("inf")
    for r in offered:  # one policy alone
        if cost.saved_bytes[r] > 0 and high / cost.saved_bytes[r] <= most_layers(cost, POLICIES[r]):
            upper = min(upper, cost.time_s + math.ceil(high / cost.saved_bytes[r]) * cost.extra_time_s[r])
    left, layers, extra = high, cost.layers, 0.0  # selective and full by rate, within the layer budget
    for _, r in sorted(x for x in rates if x[1] < 2):
        if left <= 0:
            break
        k = math.ceil(left / cost.saved_bytes[r]) if left / cost.saved_bytes[r] <= layers else layers
        left, layers, extra = left - k * cost.saved_bytes[r], layers - k, extra + k * cost.extra_time_s[r]
    if left <= 0:
        upper = min(upper, cost.time_s + extra)
    return lower, upper  # any solution that fits costs at least lower: upper >= lower


def add_objective(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    terms = []
    for c, cost in enumerate(p.costs):
        terms.append(_int(cost.time_s * TIME_SCALE) * v.y[c])
        terms.extend(_int(cost.extra_time_s[r] * TIME_SCALE) * v.k[c][r] for r in range(len(cost.extra_time_s)))
    model.minimize(sum(terms))


@dataclass(frozen=True, slots=True)
class Run:
    """A CP-SAT model solved: the solver (to read values from), its status, and the statistics."""

    solver: cp_model.CpSolver
    status: int
    wall_s: float
    variables: int
    constraints: int

    @property
    def found(self) -> bool:
        return self.status in (cp_model.OPTIMAL, cp_model.FEASIBLE)

    @property
    def status_name(self) -> str:
        return self.solver.status_name(self.status)


def run_deterministic(model: cp_model.CpModel, time_limit_s: float) -> Run:
    """Solve ``model`` with one worker and a fixed seed, so the same input gives the same answer."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    start = time.perf_counter()
    status = solver.solve(model)
    return Run(solver=solver, status=status, wall_s=time.perf_counter() - start,
               variables=len(model.proto.variables), constraints=len(model.proto.constraints))


def solve(p: Problem, *, time_limit_s: float = 30.0) -> Solution:
    """Build the program family by family, solve it deterministically, read the answer."""
    model = cp_model.CpModel()
    v = add_variables(model, p)
    for add in (add_choose_one, add_layer_budget, add_memory_limit, add_pinned_recompute, add_objective):
        add(model, p, v)
    run = run_deterministic(model, time_limit_s)
    solver, wall_s, n_vars, n_cons = run.solver, run.wall_s, run.variables, run.constraints
    if not run.found:
        return Solution(status=run.status_name, candidate=-1, recompute_layers=(0, 0), objective_s=0.0,
                        bound_s=0.0, wall_s=wall_s, variables=n_vars, constraints=n_cons)
    chosen = next(c for c in range(len(p.costs)) if solver.value(v.y[c]))
    return Solution(status=run.status_name, candidate=chosen,
                    recompute_layers=tuple(solver.value(x) for x in v.k[chosen][:len(p.costs[chosen].extra_time_s)]),
                    objective_s=solver.objective_value / TIME_SCALE, bound_s=solver.best_objective_bound / TIME_SCALE,
                    wall_s=wall_s, variables=n_vars, constraints=n_cons)
