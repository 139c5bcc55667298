"""Rank-side code for tests/runtime/test_runtime_memory.py: measure what a plan's step really holds."""
from __future__ import annotations

import gc
from pathlib import Path

import torch

from meshplan import ir, zoo
from meshplan.runtime import apply
from meshplan.runtime.memory import measure_plan_memory
from meshplan.runtime.train import synthetic_batch


def measure(rank: int, world_size: int, plans: dict[str, dict], outdir: Path) -> None:
    out = {}
    for name, data in plans.items():
        plan = ir.Plan.from_dict(data)
        batch = lambda step: synthetic_batch(plan.model["vocab"], plan.global_batch, plan.seq_len, 0, step)  # noqa: E731

        def setup(plan=plan):
            torch.manual_seed(0)
            pm = apply(plan, zoo.build_from_config(plan.model))
            pm.step(*batch(0))
            # start-up collectives done on every rank and their buffers collected before the measured step. This
            # alone did not keep DDP's 21 MB wrap-time broadcast copy (_sync_module_states) out of a CI run's
            # measured step (ddp_full 134.1 MB, 113.0 MB in every run alone): gloo's worker thread dropped it,
            # unrecorded; the replay now ends such a block once /proc/self/maps shows it unmapped (runtime.memory)
            torch.distributed.barrier()
            gc.collect()
            return pm

        out[name] = measure_plan_memory(setup, lambda pm: pm.step(*batch(1)))
    torch.save(out, outdir / f"rank{rank}.pt")
