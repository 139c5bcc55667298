"""When nothing fits: name the memory the least hungry strategy needs against what a GPU has, and
the smallest cluster of the same kind (doubling the nodes) on which some strategy fits."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from ..cost_model import Cluster
from ..ir import InfeasibleError, PlanError, limits

if TYPE_CHECKING:
    from .search import Request

GB = 1e9
MAX_NODES = 4096


def infeasible(req: "Request", cands: list, floors: dict, limit: float,
               recompute: str | None = None) -> InfeasibleError:
    """Why no candidate fits: the least memory one needs (``floors``: by candidate, ``search.memory_floor`` under
    ``recompute``), with the recompute the user pinned (else the policy that saves the most), and what would fit."""
    i = min(floors, key=floors.__getitem__)
    need = floors[i]
    name = req.model.get("name") or req.graph.dims.family
    if recompute is not None and not math.isfinite(need):
        return InfeasibleError(f"{name}: no candidate on {req.cluster.spec} offers recompute {recompute!r} as pinned "
                               "(offloading needs a host link and a program that runs it); pin another policy or "
                               "leave recompute free")
    if recompute is not None:
        return InfeasibleError(
            f"{name} needs {need / GB:.1f} GB per GPU at best ({cands[i].describe()}, recompute {recompute!r} as "
            f"pinned) but a {req.cluster.accelerator.name} has {limit / GB:.1f} GB usable on {req.cluster.spec}; leave recompute "
            "free (or pin 'full'), use more GPUs, or a smaller micro-batch or sequence")
    gpus = gpus_that_fit(req)
    hint = f"use at least {gpus} GPUs" if gpus else f"no {req.cluster.name} cluster up to {MAX_NODES} nodes fits it"
    return InfeasibleError(
        f"{name} needs {need / GB:.1f} GB per GPU at best ({cands[i].describe()}, full recompute) but a "
        f"{req.cluster.accelerator.name} has {limit / GB:.1f} GB usable on {req.cluster.spec}; {hint}, "
        "or a smaller micro-batch or sequence")


def gpus_that_fit(req: "Request") -> int:
    """The GPU count of the smallest cluster (nodes doubling) on which some candidate fits."""
    from .search import memory_floor
    from .space import candidates, scale_up_gpus

    nodes = req.cluster.nodes * 2
    pins = {k: v for k, v in (req.fixed or {}).items() if k not in ("dp", "tp", "pp", "num_microbatches")}
    while nodes <= MAX_NODES and nodes * req.cluster.gpus_per_node <= limits.MAX_GPUS:
        try:
            bigger = Cluster.preset(req.cluster.name, nodes=nodes, gpus_per_node=req.cluster.gpus_per_node)
        except PlanError:
            return 0  # not a preset: no way to say what a bigger one would be
        world = bigger.world_size
        batch = world * -(-req.global_batch // world)  # divisible by every dp that divides the world
        sub = replace(req, cluster=bigger, global_batch=batch, fixed=pins)
        for cand in candidates(req.graph.dims, world=world, domain=scale_up_gpus(bigger), global_batch=batch,
                               seq_len=req.seq_len, fixed=pins, runtime=req.runtime):
            if cand.micro_batch != 1 or cand.zero not in (0, 3) or cand.schedule not in ("1f1b",):
                continue
            if memory_floor(sub, cand) <= bigger.accelerator.usable_memory_bytes:
                return world
        nodes *= 2
    return 0
