"""What each rank runs in the context-parallel tests: one zoo attention module on its own (outputs and
gradients against the whole sequence on one process, with and without load balance), then plans
trained for a few steps."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from meshplan import zoo
from meshplan.runtime import apply
from meshplan.runtime.context import context_parallel, sequence_positions, sequence_share
from meshplan.runtime.train import synthetic_batch
from parity_cases import _structure
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, STEPS, make_plan, optimizer


def _attention_alone(model: str, cp_mesh, load_balance: bool) -> dict[str, float]:
    """The largest differences between one attention module run on this rank's tokens and the same
    module on whole sequences: its output, and its weights' gradients summed over the cp ranks."""
    torch.manual_seed(SEED)
    whole = zoo.build(model).layers[0].attn
    local = zoo.build(model).layers[0].attn
    local.load_state_dict(whole.state_dict())
    context_parallel(local, cp_mesh, load_balance=load_balance)
    x = torch.randn(2, SEQ_LEN, whole.wq.in_features, generator=torch.Generator().manual_seed(1))
    weight = torch.randn(2, SEQ_LEN, whole.wo.out_features, generator=torch.Generator().manual_seed(2))
    (whole(x) * weight).sum().backward()
    rank, size = cp_mesh.get_local_rank(), cp_mesh.size()
    share = lambda t: sequence_share(t, size, rank, load_balance=load_balance)  # noqa: E731
    out = local(share(x))
    (out * share(weight)).sum().backward()
    errors = {"output": (out - share(whole(x))).abs().max().item()}
    for name, param in local.named_parameters():
        grad = param.grad.clone()
        dist.all_reduce(grad, group=cp_mesh.get_group())  # each rank holds its tokens' share of the gradient
        errors[name] = (grad - dict(whole.named_parameters())[name].grad).abs().max().item()
    return errors


def run_alone(world_size: int) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("cp",))
    out: dict[str, Any] = {f"{model} balance={lb}": _attention_alone(model, mesh["cp"], lb)
                           for model in ("gpt-tiny", "llama-tiny") for lb in (True, False)}
    rank = mesh.get_local_rank()
    out["positions"] = {lb: sequence_positions(SEQ_LEN, world_size, rank, lb).tolist() for lb in (True, False)}
    return out


def _train(pm, vocab: int, mode: str) -> tuple[list[float], list[int]]:
    """``step``: pm.step on the global batch; ``hand``: a hand-written loop over pm.local_batch,
    pm.module and pm.optimizer, the loss averaged over pm.loss_group. Also the local input shape."""
    losses, shape = [], []
    for step in range(1, STEPS + 1):
        x, y = synthetic_batch(vocab, GLOBAL_BATCH, SEQ_LEN, SEED, step)
        xs, ys = pm.local_batch(x, y)
        shape = list(xs.shape)
        if mode == "step":
            losses.append(pm.step(x, y))
            continue
        loss = zoo.loss_fn(pm.module(xs), ys)
        loss.backward()
        pm.optimizer.step()
        pm.optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, group=pm.loss_group)
        losses.append(total.item() / pm.loss_ranks)
    return losses, shape


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    """``payload``: {"cases": [{name, model, plan: make_plan kwargs, mode}], "alone": bool}."""
    results: dict[str, Any] = {}
    if payload.get("alone"):
        results["alone"] = run_alone(world_size)
    for case in payload["cases"]:
        plan = make_plan(case["model"], **case["plan"])
        torch.manual_seed(SEED)
        model = zoo.build(case["model"])
        pm = apply(plan, model, optimizer=optimizer)
        losses, shape = _train(pm, model.config.vocab, case.get("mode", "step"))
        swapped = sum(type(m).__name__.startswith("ContextParallel") for m in pm.module.modules())
        info = {"local_shape": shape, "swapped": swapped, "cp_rank": pm.sequence.cp_rank, **_structure(pm)}
        params = pm.full_parameters()
        results[case["name"]] = {"losses": losses, "params": params if rank == 0 else None, **info}
        del pm, model
    torch.save(results, outdir / f"rank{rank}.pt")
