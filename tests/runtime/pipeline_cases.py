"""What each rank runs in the pipeline parity tests: every case trains a fresh model under a pipelined
plan for a few steps and writes its losses (every rank), the whole model's parameters (rank 0) and
what this rank holds, for the test to compare with one process."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from meshplan import ir, zoo
from meshplan.runtime import apply
from meshplan.runtime.clip import compile_blocks
from meshplan.runtime.expert import ExpertParallelMixin
from meshplan.runtime.pipeline import Absent, holds
from meshplan.runtime.train import synthetic_batch
from meshplan.solver.stages import bounds, megatron_counts
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, STEPS, optimizer


def even_stages(layers: int, count: int) -> tuple[tuple[int, int], ...]:
    """``count`` stages of (nearly) equal layer counts, the larger ones first."""
    size, extra = divmod(layers, count)
    bounds = [0]
    for c in range(count):
        bounds.append(bounds[-1] + size + (c < extra))
    return tuple(zip(bounds[:-1], bounds[1:]))


def megatron_stages(layers: int, pp: int, vp: int, **flags) -> tuple[tuple[int, int], ...]:
    """Stages as Megatron-LM's uneven-pipeline flags place them (``solver/stages.megatron_counts``)."""
    return bounds(megatron_counts(layers, pp, vp, **flags))


def pipeline_plan(model: str, *, pp: int, dp: int = 1, tp: int = 1, ep: int = 1, cp: int = 1, zero: int = 0,
                  sp: bool = False, nmb: int = 2, schedule: str = "1f1b", vp: int = 1, stages: tuple = (),
                  recompute: tuple[str, ...] = (), layers: int | None = None) -> ir.Plan:
    cfg = zoo.config(model, **({"layers": layers} if layers else {})).to_dict()
    return ir.Plan(model=cfg, cluster="cpu:1x8", global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN,
                   mesh=ir.Mesh(pp=pp, dp=dp, tp=tp, ep=ep, cp=cp), zero_stage=zero, sequence_parallel=sp,
                   micro_batch_size=GLOBAL_BATCH // (dp * nmb), num_microbatches=nmb, schedule=schedule, vp=vp,
                   stages=tuple(stages) or even_stages(cfg["layers"], pp * vp),
                   recompute=recompute or ("none",) * cfg["layers"], dtype="float32")


def _numel(p: torch.Tensor) -> int:
    return (p.to_local() if hasattr(p, "to_local") else p).numel()


def _holdings(pm) -> dict[str, Any]:
    """What this rank holds: its stage ids, block indices, parameter elements, DTensors, wrappers."""
    params = list(pm.module.parameters())
    return {"stage_ids": pm.pipeline.stage_ids,
            "layers": [i for i, block in enumerate(pm.module.layers) if not isinstance(block, Absent)],
            "parts": sorted(n for n in ("embed", "norm", "output") if holds(pm.module, n)),
            "local_numel": sum(_numel(p) for p in params),
            "expert_numel": sum(_numel(p) for m in pm.module.modules() if isinstance(m, ExpertParallelMixin)
                                for p in m.parameters(recurse=False)),
            "dtensors": sum(hasattr(p, "to_local") for p in params),
            "checkpointed": sum("CheckpointWrapper" in type(m).__name__ for m in pm.module.modules()),
            "schedule": type(pm.pipeline.schedule).__name__, "pp_rank": pm.mesh.get_local_rank("pp"),
            "dp_rank": pm.dp_rank, "dp_size": pm.dp_size}


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    """``payload``: {"cases": [{name, model, plan: pipeline_plan kwargs, compile}]}."""
    results = {}
    for case in payload["cases"]:
        plan = pipeline_plan(case["model"], **case["plan"])
        torch.manual_seed(SEED)
        model = zoo.build_from_config(plan.model)
        if case.get("compile"):  # --compile: each block's forward compiled before the split (graphs, no kernels)
            compile_blocks(model, "layers", backend="aot_eager")
        pm = apply(plan, model, optimizer=optimizer)
        losses = []
        for step in range(1, STEPS + 1):
            x, y = synthetic_batch(model.config.vocab, GLOBAL_BATCH, SEQ_LEN, SEED, step)
            losses.append(pm.step(x, y))
        params = pm.full_parameters()
        results[case["name"]] = {"losses": losses, "params": params if rank == 0 else None, **_holdings(pm)}
        del pm, model
    torch.save(results, outdir / f"rank{rank}.pt")
