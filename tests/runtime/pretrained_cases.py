"""What each rank runs in the pretrained-weights tests (4 gloo processes, one launch).

HF Llama cases: build the plan's model from other initial weights, shard it, ``load_pretrained`` the
checkpoint transformers saved, write it back with ``save_pretrained`` (before any step), then take
one step and report its loss and the clipped gradient norm. Zoo cases: save under one plan, load under
another (pp2 x dp2, ep2), report the full parameters. MoE cases: a Mixtral checkpoint with its experts stored one
by one, loaded under ep and pp: the loaded parameters and the first loss. A checkpoint of another
size is refused on every rank, naming the first parameter."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from meshplan import ir, zoo
from meshplan.runtime import apply
from meshplan.runtime.checkpoint import CheckpointError
from meshplan.runtime.clip import install_clipping
from meshplan.runtime.source import build
from meshplan.runtime.train import synthetic_batch
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, optimizer

OTHER_SEED = 1234  # the sharded model starts from other weights, so that a load that did nothing shows
CLIP, SGD_LR = 0.5, 0.1  # small enough that every case clips; SGD shows a wrong norm at once (Adam would not)


def sgd(params):
    return torch.optim.SGD(params, lr=SGD_LR)


def _optimizer(case: dict):
    return sgd if case.get("clip") else optimizer


def _step(pm, case: dict, vocab: int) -> dict[str, Any]:
    """One step on synthetic batch 1 (clipped to ``CLIP`` if the case says so): its loss and the norm."""
    if case.get("clip"):
        install_clipping(pm, CLIP)
    x, y = synthetic_batch(vocab, GLOBAL_BATCH, SEQ_LEN, SEED, 1)
    loss = pm.step(x, y)
    return {"loss": loss, "norm": getattr(pm, "last_grad_norm", None)}


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    results: dict[str, Any] = {}
    for case in payload["hf"]:
        plan = ir.Plan.from_json(case["plan"])
        torch.manual_seed(OTHER_SEED)
        pm = apply(plan, build(plan.source), optimizer=_optimizer(case))
        pm.load_pretrained(case.get("checkpoint", payload["checkpoint"]))
        out = outdir / f"saved-{case['name'].replace(' ', '-')}"
        pm.save_pretrained(str(out))
        result = _step(pm, case, plan.model["vocab"])
        params = pm.full_parameters()
        results[case["name"]] = {**result, "saved": str(out), "params": params if rank == 0 else None}
    for case in payload["zoo"]:
        torch.manual_seed(SEED)
        pm = apply(ir.Plan.from_json(case["save_plan"]), zoo.build(case["model"]), optimizer=optimizer)
        before = pm.full_parameters()
        out = outdir / f"zoo-{case['name'].replace(' ', '-')}"
        pm.save_pretrained(str(out))
        torch.manual_seed(OTHER_SEED)
        pm = apply(ir.Plan.from_json(case["load_plan"]), zoo.build(case["model"]), optimizer=_optimizer(case))
        pm.load_pretrained(str(out))
        loaded = pm.full_parameters()
        result = _step(pm, case, 512)
        params = pm.full_parameters()
        results[case["name"]] = {**result, "before": before if rank == 0 else None,
                                 "loaded": loaded if rank == 0 else None, "params": params if rank == 0 else None}
    for case in payload.get("moe", []):  # experts stored one by one: assembled at load
        plan = ir.Plan.from_json(case["plan"])
        torch.manual_seed(OTHER_SEED)
        pm = apply(plan, build(plan.source), optimizer=optimizer)
        pm.load_pretrained(case["checkpoint"])
        loaded = pm.full_parameters()
        results[case["name"]] = {**_step(pm, case, plan.model["vocab"]), "loaded": loaded if rank == 0 else None}
    plan = ir.Plan.from_json(payload["hf"][0]["plan"])
    torch.manual_seed(OTHER_SEED)
    pm = apply(plan, build(plan.source), optimizer=optimizer)
    try:
        pm.load_pretrained(payload["other"])
        results["mismatch"] = None
    except CheckpointError as exc:
        results["mismatch"] = str(exc)
    torch.save(results, outdir / f"rank{rank}.pt")
