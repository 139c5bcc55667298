"""What each rank runs in the checkpoint tests: train 2 steps under one plan and save; then, in fresh
models with other initial weights, load under other plans and train 2 more steps; record the
losses (every rank), the final parameters (rank 0) and the errors a wrong checkpoint raises."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from meshplan import ir, zoo
from meshplan.runtime import apply
from meshplan.runtime.checkpoint import CheckpointError
from meshplan.runtime.train import synthetic_batch
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, make_plan, optimizer

SAVE_AT, TOTAL = 2, 4
OTHER_SEED = 1234  # loaded models start from other weights, so a load that did nothing shows


def _train(pm, vocab: int, steps: range) -> list[float]:
    return [pm.step(*synthetic_batch(vocab, GLOBAL_BATCH, SEQ_LEN, SEED, step)) for step in steps]


def plan_for(model: str, *, pp: int = 1, replicate: tuple[str, ...] = (), **kwargs: Any) -> ir.Plan:
    """``make_plan``, and with ``pp`` > 1 a pipeline of ``pp`` equal stages (1F1B) in front; with
    ``replicate``, those sublayers kept whole over tp (tp_layout_cases.layouts_plan)."""
    if replicate:
        from tp_layout_cases import layouts_plan

        return layouts_plan(model, tuple(replicate), **kwargs)
    plan = make_plan(model, **kwargs)
    if pp == 1:
        return plan
    layers = plan.model["layers"]
    bounds = [layers * c // pp for c in range(pp + 1)]
    return dataclasses.replace(plan, mesh=dataclasses.replace(plan.mesh, pp=pp), stages=tuple(zip(bounds, bounds[1:])))


def _fresh(model: str, plan: ir.Plan, seed: int = OTHER_SEED):
    torch.manual_seed(seed)
    return apply(plan, zoo.build(model), optimizer=optimizer)


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    """``payload``: {"saves": {id: {model, plan}}, "loads": [{name, save, plan}], "errors": bool}."""
    results: dict[str, Any] = {}
    for save_id, case in payload["saves"].items():
        pm = _fresh(case["model"], plan_for(case["model"], **case["plan"]), seed=SEED)
        results[save_id] = {"losses": _train(pm, 512, range(1, SAVE_AT + 1))}
        pm.save(str(outdir / save_id))
    for case in payload["loads"]:
        model = payload["saves"][case["save"]]["model"]
        pm = _fresh(model, plan_for(model, **case["plan"]))
        step = pm.load(str(outdir / case["save"]))
        losses = _train(pm, 512, range(step + 1, TOTAL + 1))
        params = pm.full_parameters()
        results[case["name"]] = {"step": step, "steps_done": pm.steps_done, "losses": losses,
                                 "params": params if rank == 0 else None}
    if payload.get("errors"):
        results["errors"] = _errors(outdir / next(iter(payload["saves"])), world_size)
    torch.save(results, outdir / f"rank{rank}.pt")


def _errors(gpt_checkpoint: Path, world_size: int) -> dict[str, str]:
    """Loading a gpt-tiny checkpoint into other models, and a directory that holds none."""
    messages = {}
    wider = zoo.config("gpt-tiny", vocab=256).to_dict()
    others = {"other family": ("llama-tiny", make_plan("llama-tiny", dp=world_size)),
              "other vocab": (wider, dataclasses.replace(make_plan("gpt-tiny", dp=world_size), model=wider))}
    for kind, (model, plan) in others.items():
        net = zoo.build(model) if isinstance(model, str) else zoo.build_from_config(model)
        pm = apply(plan, net, optimizer=optimizer)
        try:
            pm.load(str(gpt_checkpoint))
        except CheckpointError as exc:
            messages[kind] = str(exc)
    try:
        pm.load(str(gpt_checkpoint.parent / "nothing-here"))
    except CheckpointError as exc:
        messages["missing"] = str(exc)
    return messages

