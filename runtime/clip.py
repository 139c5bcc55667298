"""Gradient clipping by the global norm over every mesh axis, and ``torch.compile`` of each block.

``clip_grad_norm_(pm, max_norm)`` computes the norm of the whole model's gradient, the one a single
process would compute, whatever the plan holds where:

- DTensor gradients (TP, FSDP2, HSDP, over any mesh): per mesh, ``torch.nn.utils.get_total_norm`` of
  that mesh's gradients is a DTensor whose ``full_tensor()`` sums the shards (``Shard`` dims add up,
  ``Replicate`` dims count once): torch's own handling, grouped by mesh because one ``foreach`` norm
  cannot mix meshes (torchtitan groups the same way);
- plain gradients (DDP, ZeRO-1) are whole and the same on every dp rank: counted once;
- expert parallelism: each ep rank holds other experts, so their squared norms add over the ep group;
- pipeline parallelism: each pp rank holds other stages, so everything adds over the pp group, except the
  last stage's copy of a head tied to the embedding (``LocalStages.tied_copies``), which the first stage counts.

Then every gradient is scaled by ``max_norm / (norm + 1e-6)`` if that is below 1, as
``torch.nn.utils.clip_grad_norm_`` does. ``install_clipping`` runs it as an optimizer step pre-hook,
so ``PlannedModule.step`` clips between the last backward and the optimizer step; an emitted script
calls ``clip_grad_norm_(model, max_norm, pp_group)`` itself before ``optimizer.step()``, the same code.
"""
from __future__ import annotations

import functools
import math
from collections import defaultdict
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor

from ..ir import PlanError
from .expert import expert_shard_groups
from .materialize import clean_name

EPS = 1e-6  # as torch.nn.utils.clip_grads_with_norm_


def global_grad_norm(module: nn.Module, pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The 2-norm of every gradient of ``module`` over every rank (a collective; the same on every rank).
    A tied head's copy on a pipeline's last stage (``LocalStages.tied_copies``) is counted on the first stage."""
    ep_groups = expert_shard_groups(module)
    copies = getattr(module, "tied_copies", {})
    by_mesh: dict[tuple, list[torch.Tensor]] = defaultdict(list)  # (ep group, mesh) -> DTensor grads
    plain: dict[object, list[torch.Tensor]] = defaultdict(list)  # ep group -> plain grads
    for name, param in module.named_parameters():
        if param.grad is None or clean_name(name) in copies:
            continue
        group = ep_groups.get(id(param))
        if isinstance(param.grad, DTensor):
            by_mesh[(group, param.grad.device_mesh)].append(param.grad)
        else:
            plain[group].append(param.grad)
    device = next((p.device for p in module.parameters()), torch.device("cpu"))  # NCCL reduces on the GPU
    squares: dict[object, torch.Tensor] = defaultdict(lambda: torch.zeros((), dtype=torch.float64, device=device))
    for (group, _), grads in by_mesh.items():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        squares[group] = squares[group] + norm.full_tensor().double().to(device) ** 2
    for group, grads in plain.items():
        squares[group] = squares[group] + torch.nn.utils.get_total_norm(grads, 2.0).double().to(device) ** 2
    total = squares[None].clone()
    for group in dict.fromkeys(ep_groups.values()):  # in module order: the same on every rank
        value = squares[group].clone()  # zero where this rank's experts have no gradient
        dist.all_reduce(value, group=group)  # the other ep ranks' experts
        total += value
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)  # the other stages
    return total.sqrt()


def clip_grad_norm_(module: nn.Module, max_norm: float, pp_group: dist.ProcessGroup | None = None) -> float:
    """Scale ``module``'s gradients so that their global 2-norm is at most ``max_norm``; returns the
    norm before clipping (the same on every rank). A collective. A tied head's copy is scaled like the
    weight it copies, and counted once (``global_grad_norm``)."""
    norm = float(global_grad_norm(module, pp_group))
    coef = max_norm / (norm + EPS)
    if coef < 1.0 and math.isfinite(norm):
        with torch.no_grad():
            for param in module.parameters():
                if param.grad is not None:
                    param.grad.mul_(coef)
    return norm


def check_max_norm(max_norm: float) -> None:
    if not (isinstance(max_norm, (int, float)) and math.isfinite(max_norm) and max_norm > 0):
        raise PlanError(f"--clip-grad is {max_norm} but must be a positive finite number (the largest global "
                        "gradient norm kept); omit it to train without clipping")


def install_clipping(pm, max_norm: float) -> None:
    """Clip ``pm``'s gradients to ``max_norm`` before each optimizer step (a step pre-hook); the last
    norm is kept in ``pm.last_grad_norm``."""
    check_max_norm(max_norm)
    pp_group = pm.pipeline.group if pm.pipeline is not None else None

    def clip(optimizer, args, kwargs) -> None:  # noqa: ARG001 - the hook's signature
        pm.last_grad_norm = clip_grad_norm_(pm.module, max_norm, pp_group)

    pm.optimizer.register_step_pre_hook(clip)


def compile_blocks(model: nn.Module, blocks: str, backend: str = "inductor") -> int:
    """``torch.compile`` the forward of each block under the container at module path ``blocks``, in place
    (names, parameters and hooks unchanged, so sharding and checkpoints see the same model); returns how
    many. It runs after the build and before sharding (torchtitan compiles later, after tensor parallelism
    and recomputation, before FSDP): the hooks sharding adds run eagerly around the compiled forward.
    ``backend``: torch.compile's (the tests take "aot_eager": the same graphs and autograd, without generating
    kernels).

    An input that a collective still fills (``AsyncCollectiveTensor``: the output of an embedding that
    tensor parallelism shards, which torch's styles redistribute with ``async_op=True``) is waited for
    before it enters the compiled graph: a compiled region takes it as its input, but its backward does
    not return the gradient to the redistribution that made it (on torch 2.13 the embedding's gradient
    is lost under dp x tp, or the backward fails under tp alone with "'Tensor' object has no attribute
    '_local_tensor'"; pytorch/pytorch#118671 syncs such tensors at graph boundaries for the same reason)."""
    container = model.get_submodule(blocks) if blocks else None
    if container is None or not list(container.children()):
        raise PlanError(f"--compile compiles each block of the model's block container {blocks!r}, but the model "
                        "has none there; omit --compile for this model")
    count = 0
    for block in container.children():
        block.forward = _waiting(torch.compile(block.forward, backend=backend))
        count += 1
    return count


class _Wait(torch.autograd.Function):
    """An ``AsyncCollectiveTensor``'s finished value as a plain tensor; the gradient passes through."""

    @staticmethod
    def forward(ctx: Any, x: AsyncCollectiveTensor) -> torch.Tensor:  # noqa: ARG004 - autograd's signature
        return x.trigger_wait()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return grad


def _waited(value: Any) -> Any:
    return _Wait.apply(value) if isinstance(value, AsyncCollectiveTensor) else value


def _waiting(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` called with every pending collective among its arguments finished (``_Wait``)."""
    @functools.wraps(compiled)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return compiled(*map(_waited, args), **{k: _waited(v) for k, v in kwargs.items()})

    return forward
