"""What each rank runs in the expert-parallel tests: the dispatch on its own (identity experts, and
experts that mark each slot with their global id), then plans trained for a few steps."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from meshplan import zoo
from meshplan.runtime import apply
from meshplan.runtime.expert import ExpertParallelMixin, dispatch_combine
from parity_cases import _structure, _train
from parity_support import SEED, make_plan, optimizer

NUM_EXPERTS, HIDDEN = 4, 3


def _slots(rank: int) -> tuple[torch.Tensor, list[int]]:
    """This rank's token slots sorted by expert; some experts get none from some ranks."""
    counts = [(rank + e) % 3 for e in range(NUM_EXPERTS)]  # zeros included
    x = torch.randn(sum(counts), HIDDEN, generator=torch.Generator().manual_seed(rank), requires_grad=True)
    return x, counts


def _dispatch(group: dist.ProcessGroup, rank: int) -> dict[str, bool]:
    """Identity experts give back the input; experts that scale by (global id + 1) give each slot its
    expert's factor, and the input gradient is that factor (the gradient scaling leaves it alone)."""
    ep, ep_rank = group.size(), dist.get_rank(group)
    per_rank = NUM_EXPERTS // ep
    x, counts = _slots(rank)
    same = dispatch_combine(x, counts, group, lambda slots, local_counts: slots)

    def scaled(slots: torch.Tensor, local_counts: list[int]) -> torch.Tensor:
        factor = torch.repeat_interleave(torch.arange(len(local_counts)) + ep_rank * per_rank + 1.0,
                                         torch.tensor(local_counts))
        return slots * factor[:, None]

    out = dispatch_combine(x, counts, group, scaled)
    expect = torch.repeat_interleave(torch.arange(NUM_EXPERTS) + 1.0, torch.tensor(counts))[:, None]
    out.sum().backward()
    return {"identity": torch.equal(same, x), "experts": torch.equal(out, x * expect),
            "grad": torch.equal(x.grad, expect.expand_as(x))}


def run_dispatch(rank: int, world_size: int) -> dict[str, dict[str, bool]]:
    mesh = init_device_mesh("cpu", (world_size // 2, 2), mesh_dim_names=("edp", "ep"))
    return {"ep=world": _dispatch(dist.group.WORLD, rank), "ep=2": _dispatch(mesh["ep"].get_group(), rank)}


def _expert_numel(pm) -> int:
    """Elements of expert weights held on this rank (after ep and FSDP)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for m in pm.module.modules()
               if isinstance(m, ExpertParallelMixin) for p in m.parameters(recurse=False))


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    """``payload``: {"cases": [{name, model, plan: make_plan kwargs}], "dispatch": bool}."""
    results: dict[str, Any] = {}
    if payload.get("dispatch"):
        results["dispatch"] = run_dispatch(rank, world_size)
    for case in payload["cases"]:
        plan = make_plan(case["model"], **case["plan"])
        torch.manual_seed(SEED)
        model = zoo.build(case["model"])
        pm = apply(plan, model, optimizer=optimizer)
        losses = _train(pm, model.config.vocab, case.get("mode", "step"))
        info = {"expert_numel": _expert_numel(pm), **_structure(pm)}
        params = pm.full_parameters()
        results[case["name"]] = {"losses": losses, "params": params if rank == 0 else None, **info}
        del pm, model
    torch.save(results, outdir / f"rank{rank}.pt")
