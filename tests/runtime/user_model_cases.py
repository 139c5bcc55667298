"""What each rank runs in the user-model parity tests: the plan's own source builds the model (a
Hugging Face config, or a ``module:function`` builder), ``apply`` shards that module object, and it
trains a few steps; losses (every rank) and full parameters (rank 0) come back for the test."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from meshplan import ir
from meshplan.runtime import apply
from meshplan.runtime.materialize import build_on_meta
from meshplan.runtime.planned import logits_of, token_cross_entropy
from meshplan.runtime.source import build
from meshplan.runtime.train import synthetic_batch
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, STEPS, optimizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # user_models, in the rank processes too
import user_models  # noqa: E402


def build_seeded(source: dict) -> torch.nn.Module:
    torch.manual_seed(SEED)  # every rank, and the reference, build the same initial weights
    return build(source)


def reference(source: dict, vocab: int, make_optimizer=optimizer) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the whole batch: the model as its library runs it (a Hugging Face model without cache)."""
    net = build_seeded(source)
    opt = make_optimizer(net.parameters())
    kwargs = {"use_cache": False} if source["kind"] == "hf" else {}
    losses = []
    for step in range(1, STEPS + 1):
        x, y = synthetic_batch(vocab, GLOBAL_BATCH, SEQ_LEN, SEED, step)
        loss = token_cross_entropy(logits_of(net(x, **kwargs)), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in net.named_parameters()}


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    results = {}
    for case in payload["cases"]:
        plan = ir.Plan.from_json(case["plan"])
        # built on meta as `meshplan run` builds it (materialize fills each rank's shards), or whole
        model = build_on_meta(plan.source, SEED) if case.get("meta") else build_seeded(plan.source)
        pm = apply(plan, model, optimizer=optimizer)
        # apply shards the given module object, not a rebuilt one (a pipeline stage holds the model's own
        # blocks in a copy of its root)
        held = {id(m) for m in pm.module.modules()}
        assert id(model) in held or any(id(m) in held for m in model.modules() if next(m.parameters(), None) is not None), \
            "apply must shard the given module"
        losses = []
        for step in range(1, STEPS + 1):
            x, y = synthetic_batch(case["vocab"], GLOBAL_BATCH, SEQ_LEN, SEED, step)
            losses.append(pm.step(x, y))
        params = pm.full_parameters()
        results[case["name"]] = {"losses": losses, "params": params if rank == 0 else None,
                                 "built": list(user_models.BUILT), "steps": pm.program.describe()}
    if "resume" in payload:  # saved under one plan after a step, loaded under another into other weights
        case = payload["resume"]
        first, then = (ir.Plan.from_json(case[key]) for key in ("save", "load"))
        pm = apply(first, build_seeded(first.source), optimizer=optimizer)
        losses = [pm.step(*synthetic_batch(case["vocab"], GLOBAL_BATCH, SEQ_LEN, SEED, 1))]
        pm.save(str(outdir / "resume"))
        torch.manual_seed(SEED + 1)
        pm = apply(then, build(then.source), optimizer=optimizer)
        step = pm.load(str(outdir / "resume"))
        losses += [pm.step(*synthetic_batch(case["vocab"], GLOBAL_BATCH, SEQ_LEN, SEED, s))
                   for s in range(step + 1, STEPS + 1)]
        params = pm.full_parameters()
        results["resume"] = {"losses": losses, "params": params if rank == 0 else None}
    if "mismatch" in payload:  # a plan applied to another model than its own: refused before any step
        plan = ir.Plan.from_json(payload["mismatch"]["plan"])
        try:
            apply(plan, build_seeded(payload["mismatch"]["source"]))
            results["mismatch"] = "applied"
        except ir.InvalidPlanError as exc:
            results["mismatch"] = str(exc)
    if "cp_eager" in payload:  # context parallelism on attention that calls no SDPA: refused at its first call
        plan = ir.Plan.from_json(payload["cp_eager"]["plan"])
        pm = apply(plan, build_seeded(payload["cp_eager"]["source"]), optimizer=optimizer)
        x, y = synthetic_batch(plan.model["vocab"], GLOBAL_BATCH, SEQ_LEN, SEED, 1)
        try:
            pm.step(x, y)
            results["cp_eager"] = "stepped"
        except ir.InvalidPlanError as exc:
            results["cp_eager"] = str(exc)
    torch.save(results, outdir / f"rank{rank}.pt")
