"""Plans for a model without repeated blocks: data parallelism over the whole cluster and ZeRO.

Without blocks there is nothing to split between tensor-parallel ranks or pipeline stages, and
nothing to recompute per layer (``api.offered`` says why, in the report), so the strategies are
few: dp = world, ZeRO stage z in the stages the runtime executes, and a micro-batch size b that
divides the local batch (``num_microbatches = global_batch / (dp * b)``). Each is priced by the
per-node cost path (``cost_model/graph_cost.py``) and the fastest that fits in memory wins. With at
most 4 stages times the divisors of the local batch, enumerating them all is exact, so no integer
program is solved (the plan's solver statistics say 0 variables): the answer is optimal for the
cost model by exhaustion, and the runners-up are the best plan of each other ZeRO stage.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ..cost_model import Cluster
from ..cost_model.graph_cost import GraphWork, graph_estimate, graph_memory, graph_work
from ..ir import InfeasibleError, Mesh, Plan, PlanError, SolverInfo, limits
from .infeasible import MAX_NODES
from .layouts import param_layouts
from .search import Request, _alternative, binding
from .space import MAX_MICROBATCHES, check_fixed, divisors, zero_stages

GB = 1e9
_NOT_OFFERED = {"tp": "tensor parallelism", "pp": "pipeline parallelism", "cp": "context parallelism",
                "ep": "expert parallelism", "sp": "sequence parallelism"}


def solve_blockless(req: Request, why_not: tuple[str, ...] = ()) -> tuple[Plan, ...]:
    """The best data-parallel plan first, then the best of each other ZeRO stage. ``why_not``: the
    reasons the other parallelisms are not offered (``api.offered``), quoted when a pin asks for one."""
    start = time.perf_counter()
    cl = req.cluster
    limits.check_sizes(global_batch=req.global_batch, seq_len=req.seq_len, world=cl.world_size)
    limits.check_time_limit("time_limit_s", req.time_limit_s)
    fixed = _check_pins(req, why_not)
    works: dict[int, GraphWork] = {}
    plans = []
    for zero, micro_batch, count in _strategies(req, fixed):
        if micro_batch not in works:
            works[micro_batch] = graph_work(req.graph, cl, micro_batch=micro_batch, seq_len=req.seq_len,
                                            dtype=req.dtype)
        plan = _plan(req, zero, micro_batch, count)
        plans.append(plan.with_prediction(graph_estimate(req.graph, cl, plan, work=works[micro_batch])))
    fits = [p for p in plans if p.prediction.peak_memory_bytes <= p.prediction.memory_limit_bytes]
    if not fits:
        raise _infeasible(req, min(plans, key=lambda p: p.prediction.peak_memory_bytes), works)
    fits.sort(key=lambda p: p.prediction.step_time_s)  # stable: ties keep the lower stage, the larger micro-batch
    best_of_stage = {}
    for p in fits:
        best_of_stage.setdefault(p.zero_stage, p)
    found = list(best_of_stage.values())[:max(1, req.top)]
    wall = time.perf_counter() - start
    info = SolverInfo(status="EVALUATED" if {"zero", "micro_batch"} <= set(fixed) else "OPTIMAL", wall_s=wall,
                      gap=0.0, candidates=len(plans), pruned=len(plans) - len(fits), binding=binding(found[0]),
                      alternatives=tuple(_alternative(found[0], p) for p in found[1:]),
                      phases={"enumerate + cost": wall})
    return tuple(replace(p, solver=info if i == 0 else None) for i, p in enumerate(found))


def _check_pins(req: Request, why_not: tuple[str, ...]) -> dict[str, Any]:
    """The pins a data-parallel plan can honour; any other is refused with the reason it is not offered."""
    fixed = check_fixed(req.fixed)  # known keys, ints within their limits, a zero stage of 0..3
    for key, what in _NOT_OFFERED.items():
        if fixed.get(key) not in (None, 1, False) or fixed.get(key) is True:
            reason = next((w for w in why_not if w.startswith(what)),
                          f"{what} is not offered for a model without repeated blocks")
            raise PlanError(f"fixed: {key}={fixed[key]!r}, but {reason}; this model is planned with data "
                            f"parallelism and ZeRO only: leave {key} unset")
    if fixed.get("recompute", "none") != "none":
        raise PlanError(f"fixed: recompute={fixed['recompute']!r}, but recomputation is chosen per block and this "
                        "model has no repeated blocks; leave recompute unset or 'none'")
    if fixed.get("vp", 1) != 1:
        raise PlanError(f"fixed: vp={fixed['vp']!r} needs pipeline stages, which a model without repeated blocks "
                        "does not have; leave vp unset")
    world = req.cluster.world_size
    if fixed.get("dp", world) != world:
        raise InfeasibleError(f"fixed: dp={fixed['dp']}, but a model without repeated blocks runs data parallelism "
                              f"over all {world} GPUs of {req.cluster.spec}; pin dp={world} or leave it unset")
    if req.global_batch % world:
        raise InfeasibleError(f"the global batch {req.global_batch} does not split over dp({world}): "
                              f"{req.global_batch} % {world} = {req.global_batch % world}; use a global batch "
                              f"that divides by {world}")
    return fixed


def _strategies(req: Request, fixed: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(zero stage, micro-batch size, micro-batch count), stages ascending, micro-batches largest first."""
    local = req.global_batch // req.cluster.world_size
    stages = [z for z in zero_stages(req.runtime) if fixed.get("zero", z) == z]
    batchings = [(b, local // b) for b in reversed(divisors(local))
                 if fixed.get("micro_batch", b) == b and fixed.get("num_microbatches", local // b) == local // b
                 and (local // b <= MAX_MICROBATCHES or "num_microbatches" in fixed)]
    if not batchings:
        raise InfeasibleError(f"the pinned micro-batching (micro_batch={fixed.get('micro_batch')}, "
                              f"num_microbatches={fixed.get('num_microbatches')}) does not split the local batch "
                              f"{local} (global batch {req.global_batch} over dp({req.cluster.world_size})); pin a "
                              f"micro_batch that divides {local}, or leave it unset")
    return [(z, b, n) for z in stages for b, n in batchings]


def _plan(req: Request, zero: int, micro_batch: int, count: int, cluster: Cluster | None = None) -> Plan:
    cl = cluster or req.cluster
    names = tuple(p.name for p in req.graph.params)
    return Plan(model=req.model, cluster=cl.spec, global_batch=micro_batch * count * cl.world_size,
                seq_len=req.seq_len, mesh=Mesh(dp=cl.world_size), zero_stage=zero, micro_batch_size=micro_batch,
                num_microbatches=count, param_layouts=param_layouts(names, tp=1, zero=zero, dp=cl.world_size),
                dtype=req.dtype)


def _infeasible(req: Request, least: Plan, works: dict[int, GraphWork]) -> InfeasibleError:
    """Nothing fits: the least hungry plan's memory against the GPU's, and the smallest cluster of the
    same kind (nodes doubling, as ``infeasible.gpus_that_fit``) on which ZeRO-3 at micro-batch 1 fits."""
    pred, name = least.prediction, req.model.get("name") or "the model"
    gpus = _gpus_that_fit(req, works.get(1) or graph_work(req.graph, req.cluster, micro_batch=1,
                                                          seq_len=req.seq_len, dtype=req.dtype))
    states = sum(pred.memory_bytes[k] for k in ("params", "grads", "optimizer"))
    hint = (f"use at least {gpus} GPUs" if gpus else
            f"no {req.cluster.name} cluster up to {MAX_NODES} nodes fits it: the runtime gathers a model without "
            "repeated blocks whole on every GPU (one FSDP unit), so more GPUs do not shrink that; put its repeated "
            "layers in an nn.ModuleList, or train in a 16-bit dtype")
    return InfeasibleError(
        f"{name} needs {pred.peak_memory_bytes / GB:.1f} GB per GPU at best ({least.summary()}: "
        f"{states / GB:.1f} GB of parameters, gradients and optimizer states, "
        f"{pred.memory_bytes['activations'] / GB:.1f} GB of activations) but a {req.cluster.accelerator.name} has "
        f"{pred.memory_limit_bytes / GB:.1f} GB usable on {req.cluster.spec}; {hint}, or a smaller micro-batch")


def _gpus_that_fit(req: Request, work: GraphWork) -> int:
    """GPUs of the smallest preset cluster of this kind on which ZeRO-3 at micro-batch 1 fits, 0 if none.
    The activations of a micro-batch do not depend on the cluster, so ``work`` serves every size."""
    nodes = req.cluster.nodes * 2
    while nodes <= MAX_NODES and nodes * req.cluster.gpus_per_node <= limits.MAX_GPUS:
        try:
            bigger = Cluster.preset(req.cluster.name, nodes=nodes, gpus_per_node=req.cluster.gpus_per_node)
        except PlanError:
            return 0  # not a preset: no way to say what a bigger one would be
        memory = graph_memory(req.graph, _plan(req, 3, 1, 1, bigger), work)
        if sum(memory.values()) <= bigger.accelerator.usable_memory_bytes:
            return bigger.world_size
        nodes *= 2
    return 0
