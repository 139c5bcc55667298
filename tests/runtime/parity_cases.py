"""What each rank runs in the parity tests: every case trains a fresh model under its plan for a few
steps and writes its losses (every rank) and full parameters (rank 0) for the test to compare."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from meshplan import ir, zoo
from meshplan.runtime import apply
from meshplan.runtime.clip import compile_blocks
from meshplan.runtime.train import synthetic_batch
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, STEPS, make_plan, optimizer


def _train(pm, vocab: int, mode: str) -> list[float]:
    """``step``: pm.step on the global batch; ``local``: pm.step on this rank's slice; ``hand``: a
    hand-written loop over pm.module and pm.optimizer."""
    losses = []
    for step in range(1, STEPS + 1):
        x, y = synthetic_batch(vocab, GLOBAL_BATCH, SEQ_LEN, SEED, step)
        local = GLOBAL_BATCH // pm.dp_size
        rows = slice(pm.dp_rank * local, (pm.dp_rank + 1) * local)
        if mode == "step":
            losses.append(pm.step(x, y))
        elif mode == "local":
            losses.append(pm.step(x[rows], y[rows], local=True))
        else:
            loss = zoo.loss_fn(pm.module(x[rows]), y[rows])
            loss.backward()
            pm.optimizer.step()
            pm.optimizer.zero_grad()
            total = loss.detach().clone()
            dist.all_reduce(total, group=pm.dp_group)
            losses.append(total.item() / pm.dp_size)
    return losses


def _own_mesh(plan: ir.Plan):
    """A mesh the caller built, as apply(mesh=...) accepts it: the plan's axes and sizes."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshplan.codegen import lower

    dims = lower(plan).mesh.dims
    return init_device_mesh("cpu", tuple(n for _, n in dims), mesh_dim_names=tuple(a for a, _ in dims))


def _numel(tensors) -> int:
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() for t in tensors)


def _structure(pm) -> dict[str, int]:
    """What the steps did: parameter and optimizer-state elements held on this rank, DTensor
    parameters, checkpoint wrappers (parity alone would not notice a step that silently did nothing).
    Call after training, when the optimizer state exists."""
    optim = getattr(pm.optimizer, "optim", pm.optimizer)  # ZeroRedundancyOptimizer keeps its shard in .optim
    state = [t for s in optim.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    return {"local_numel": _numel(pm.module.parameters()), "optim_numel": _numel(state),
            "dtensors": sum(hasattr(p, "to_local") for p in pm.module.parameters()),
            "checkpointed": sum("CheckpointWrapper" in type(m).__name__ for m in pm.module.modules())}


def _plain_logits_loss(vocab: int):
    """A user's loss written for plain tensors: apply(loss_fn=...) must hand it whole, plain logits."""
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if isinstance(logits, DTensor) or logits.shape[-1] != vocab:
            raise AssertionError(f"a user's loss_fn got {type(logits).__name__} logits of shape {tuple(logits.shape)}")
        return torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
    return loss


def _logits(pm, vocab: int) -> dict[str, Any]:
    """What the sharded module returns: under TP the logits stay sharded over the vocabulary (a DTensor
    whose local part has V / tp columns) for the vocab-parallel loss."""
    x, _ = synthetic_batch(vocab, GLOBAL_BATCH, SEQ_LEN, SEED, 0)
    with torch.no_grad():
        out = pm.module(x[: GLOBAL_BATCH // pm.dp_size])
    local = out.to_local() if isinstance(out, DTensor) else out
    return {"logits_dtensor": isinstance(out, DTensor), "logits_local_vocab": local.shape[-1]}


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    """``payload``: {"cases": [{name, model, plan: make_plan kwargs, mode, compile}], "errors": bool}."""
    results = {}
    for case in payload["cases"]:
        plan = make_plan(case["model"], **case["plan"])
        torch.manual_seed(SEED)
        model = zoo.build(case["model"])
        if case.get("compile"):  # --compile: each block's forward compiled before sharding (graphs, no kernels)
            compile_blocks(model, "layers", backend="aot_eager")
        mesh = _own_mesh(plan) if case.get("own_mesh") else None
        loss_fn = _plain_logits_loss(model.config.vocab) if case.get("loss") == "user" else None
        pm = apply(plan, model, optimizer=optimizer, mesh=mesh, loss_fn=loss_fn)
        losses = _train(pm, model.config.vocab, case.get("mode", "step"))
        info = {"dp_rank": pm.dp_rank, "dp_size": pm.dp_size, **_structure(pm), **_logits(pm, model.config.vocab)}
        params = pm.full_parameters()
        results[case["name"]] = {"losses": losses, "params": params if rank == 0 else None, **info}
        del pm, model
    if payload.get("errors"):
        results["errors"] = _errors(world_size)
    torch.save(results, outdir / f"rank{rank}.pt")


def _errors(world_size: int) -> dict[str, str]:
    """Bad inputs raise InvalidPlanError with the numbers; the messages, by kind."""
    messages = {}
    wrong_world = make_plan("gpt-tiny", dp=2)
    try:
        apply(wrong_world, zoo.build("gpt-tiny"))
    except ir.InvalidPlanError as exc:
        messages["world"] = str(exc)
    try:
        apply(make_plan("gpt-tiny", dp=world_size // 2, tp=2, zero=1), zoo.build("gpt-tiny"))
    except ir.InvalidPlanError as exc:
        messages["unsupported"] = str(exc)
    try:
        apply(make_plan("gpt-tiny", dp=2, tp=2), zoo.build("gpt-tiny"), mesh=_own_mesh(make_plan("gpt-tiny", dp=4)))
    except ir.InvalidPlanError as exc:
        messages["mesh"] = str(exc)
    pm = apply(make_plan("gpt-tiny", dp=world_size, nmb=2), zoo.build("gpt-tiny"))
    x, y = synthetic_batch(512, 6, SEQ_LEN, SEED, 1)
    try:
        pm.step(x, y)
    except ir.InvalidPlanError as exc:
        messages["batch"] = str(exc)
    try:
        pm.step(x[:3], y[:3], local=True)
    except ir.InvalidPlanError as exc:
        messages["local"] = str(exc)
    return messages
