"""What each rank runs in the tensor-parallel layout tests: plans whose ``param_layouts`` keep a
sublayer (attention or MLP) replicated over tp while the other is split, trained for a few steps.

Every rank writes its losses, its full parameters (to check that tp ranks hold the same replicated
weights, not only rank 0) and what the block's sublayers hold: whether their weights are DTensors."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from meshplan import ir, zoo
from meshplan.codegen import lower
from meshplan.runtime import apply
from meshplan.runtime.train import synthetic_batch
from meshplan.solver.layouts import param_layouts
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, STEPS, make_plan, optimizer

# the linears of each sublayer as the zoo names them
LINEARS = {"gpt": {"attn": ("wq", "wk", "wv", "wo"), "mlp": ("fc1", "fc2")},
           "llama": {"attn": ("wq", "wk", "wv", "wo"), "mlp": ("w1", "w3", "w2")},
           "moe": {"attn": ("wq", "wk", "wv", "wo")}}


def layouts_plan(model: str, replicate: tuple[str, ...], **plan_kw: Any) -> ir.Plan:
    """``make_plan`` with param_layouts in which the sublayers in ``replicate`` are R over tp in every
    block (Megatron's split elsewhere), as the intra-op program would write them."""
    import dataclasses

    if plan_kw.get("pp", 1) > 1:
        from pipeline_cases import pipeline_plan

        plan = pipeline_plan(model, **plan_kw)
    else:
        plan = make_plan(model, **plan_kw)
    net_names = _param_names(model)
    family = plan.model["family"]
    tp_layouts = {name: "R" for name in net_names for sub in replicate for lin in LINEARS[family][sub]
                  if f".{sub}.{lin}." in name}
    layouts = param_layouts(net_names, tp=plan.mesh.tp, zero=plan.zero_stage, dp=plan.mesh.dp, tp_layouts=tp_layouts)
    return dataclasses.replace(plan, param_layouts=layouts)


def _param_names(model: str) -> tuple[str, ...]:
    with torch.device("meta"):
        return tuple(n for n, _ in zoo.build(model).named_parameters())


def case_plan(case: dict[str, Any]) -> ir.Plan:
    if "plan_json" in case:
        return ir.Plan.from_json(case["plan_json"])
    return layouts_plan(case["model"], tuple(case["replicate"]), **case["plan"])


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    """``payload``: {"cases": [{name, model, replicate, plan: make_plan kwargs} | {name, model, plan_json}]}."""
    results = {}
    for case in payload["cases"]:
        plan = case_plan(case)
        torch.manual_seed(SEED)
        model = zoo.build(case["model"])
        pm = apply(plan, model, optimizer=optimizer)
        losses = []
        for step in range(1, STEPS + 1):
            x, y = synthetic_batch(model.config.vocab, GLOBAL_BATCH, SEQ_LEN, SEED, step)
            losses.append(pm.step(x, y))
        results[case["name"]] = {"losses": losses, "params": pm.full_parameters(), "split": _split(pm.module),
                                 "steps": [str(s) for s in lower(plan).steps]}
        del pm, model
    torch.save(results, outdir / f"rank{rank}.pt")


def _split(module: torch.nn.Module) -> dict[str, bool]:
    """Per linear of block 0 (``attn.wq``, ``mlp.fc1``, ...): is its weight a DTensor over tp?"""
    out = {}
    for name, param in module.named_parameters():
        name = name.replace("_checkpoint_wrapped_module.", "").removeprefix("module.")
        if name.startswith("layers.0.") and name.endswith(".weight") and ("attn.w" in name or "mlp." in name):
            placements = getattr(param, "placements", ())
            mesh_names = getattr(getattr(param, "device_mesh", None), "mesh_dim_names", None) or ()
            tp_placement = placements[mesh_names.index("tp")] if "tp" in mesh_names else None
            out[name.removeprefix("layers.0.").removesuffix(".weight")] = bool(
                tp_placement is not None and tp_placement.is_shard())
    return out
