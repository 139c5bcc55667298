"""What each rank runs in the meta-init tests: every case builds its model on meta
(``runtime.materialize.build_on_meta``), lets ``apply`` shard then materialize it, trains a few steps and
writes its losses, the whole model's parameters (rank 0) and what it held, for the test to compare with
one process that built the whole model after ``torch.manual_seed``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from meshplan.runtime import apply
from meshplan.runtime.materialize import build_on_meta, is_meta
from meshplan.runtime.train import synthetic_batch
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, STEPS, make_plan, optimizer
from pipeline_cases import pipeline_plan


def case_plan(case: dict[str, Any]):
    if case.get("pipeline"):
        return pipeline_plan(case["model"], **case["plan"])
    return make_plan(case["model"], **case["plan"])


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    results = {}
    for case in payload["cases"]:
        plan = case_plan(case)
        model = build_on_meta({"kind": "zoo", "name": case["model"]}, SEED)
        built_on_meta = is_meta(model)
        pm = apply(plan, model, optimizer=optimizer)
        local = {n: (p.to_local() if hasattr(p, "to_local") else p) for n, p in pm.module.named_parameters()}
        held = sum(t.numel() for t in local.values())
        losses = []
        for step in range(1, STEPS + 1):
            x, y = synthetic_batch(plan.model["vocab"], GLOBAL_BATCH, SEQ_LEN, SEED, step)
            losses.append(pm.step(x, y))
        params = pm.full_parameters()
        offloading = sum(1 for m in pm.module.modules() if getattr(m, "_meshplan_offload_handles", None))
        results[case["name"]] = {"losses": losses, "params": params if rank == 0 else None, "held": held,
                                 "offloading": offloading,
                                 "built_on_meta": built_on_meta, "meta_left": is_meta(pm.module),
                                 "whole": sum(p.numel() for p in params.values())}
        del pm, model
    torch.save(results, outdir / f"rank{rank}.pt")
