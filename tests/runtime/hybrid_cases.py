"""What each rank runs in the hybrid-sharding (HSDP, plan.zero_group) parity test: parity_cases'
training, plus each parameter's local and full sizes and its mesh shape."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from meshplan import zoo
from meshplan.runtime import apply
from parity_cases import _structure, _train
from parity_support import SEED, make_plan, optimizer


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    """``payload``: {"cases": [{name, model, plan: make_plan kwargs, zero_group, mode, cluster?}]}."""
    results = {}
    for case in payload["cases"]:
        plan = dataclasses.replace(make_plan(case["model"], **case["plan"]), zero_group=case["zero_group"],
                                   **({"cluster": case["cluster"]} if "cluster" in case else {}))
        torch.manual_seed(SEED)
        model = zoo.build(case["model"])
        pm = apply(plan, model, optimizer=optimizer)
        losses = _train(pm, model.config.vocab, case.get("mode", "step"))
        shards = {n: (p.to_local().numel(), p.numel(), tuple(p.device_mesh.shape))
                  for n, p in pm.module.named_parameters() if hasattr(p, "to_local")}
        info = {"dp_rank": pm.dp_rank, "dp_size": pm.dp_size, "shards": shards, **_structure(pm)}
        params = pm.full_parameters()
        results[case["name"]] = {"losses": losses, "params": params if rank == 0 else None, **info}
        del pm, model
    torch.save(results, outdir / f"rank{rank}.pt")
