"""What each rank runs in the bf16 tests: each case trains llama-tiny under a bf16 plan for 20 steps and
writes its losses, the dtypes it holds (parameters, gradients, optimizer state) and the logits' dtype."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from meshplan import zoo
from meshplan.runtime import apply
from meshplan.runtime.materialize import build_on_meta
from meshplan.runtime.train import synthetic_batch
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, make_plan, optimizer
from pipeline_cases import pipeline_plan

STEPS = 20


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    results = {}
    for case in payload["cases"]:
        plan = (pipeline_plan if case.get("pipeline") else make_plan)(case["model"], **case["plan"])
        plan = dataclasses.replace(plan, dtype="bfloat16")
        model = build_on_meta({"kind": "zoo", "name": case["model"]}, SEED)
        pm = apply(plan, model, optimizer=optimizer)
        seen: list[torch.dtype] = []
        if pm.pipeline is None:  # the logits' dtype, from a hook on the output head
            head = pm.module.get_submodule("module.output" if pm._ddp else "output")
            head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        losses = []
        for step in range(1, STEPS + 1):
            x, y = synthetic_batch(plan.model["vocab"], GLOBAL_BATCH, SEQ_LEN, SEED, step)
            losses.append(pm.step(x, y))
        optim = getattr(pm.optimizer, "optim", pm.optimizer)
        states = {str(t.dtype) for s in optim.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()}
        results[case["name"]] = {
            "losses": losses, "logits": sorted({str(d) for d in seen}),
            "params": sorted({str(p.dtype) for p in pm.module.parameters()}),
            "state": sorted(states), "kinds": pm.program.kinds()}
        del pm, model
    torch.save(results, outdir / f"rank{rank}.pt")


def fp32_losses(model: str) -> list[float]:
    from parity_support import reference

    return reference(model, steps=STEPS)[0]


__all__ = ["STEPS", "fp32_losses", "run_cases", "zoo"]
