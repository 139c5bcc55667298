"""Activations kept in host memory (``Recompute.OFFLOAD``, Megatron-Core's ``--cpu-offloading-num-layers``):
what autograd saves inside a block's forward is copied to pinned host memory as it is saved and copied back
when the backward unpacks it, so the GPU holds none of the block's activations between its forward and its
backward.

``offload_activations(module)`` registers a forward pre-hook that enters
``torch.autograd.graph.saved_tensors_hooks`` and a forward hook (called also when the forward raises) that
leaves it: the module keeps its name and state-dict keys, unlike a wrapper. The packing is
``torch.autograd.graph.save_on_cpu``'s (a blocking ``copy_`` into pinned memory, an asynchronous copy back
on the compute stream: the cost model prices both as exposed, ``Software.offload_overlap``), except that it
keeps parameters (FSDP2's gathered ones too, which the backward finds where they are), tensor subclasses
(DTensor: the search offers offloading without TP only) and tensors already in host memory as they are.
On CPU ranks nothing moves, and the cost model counts nothing saved (``estimate._ranks``).
"""
from __future__ import annotations

from typing import Any

import torch

_HANDLES = "_meshplan_offload_handles"


def _pack(tensor: torch.Tensor) -> Any:
    if type(tensor) is not torch.Tensor or tensor.device.type == "cpu" or tensor.layout != torch.strided:
        return tensor  # a parameter, a DTensor, or already in host memory
    host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                       pin_memory=torch.cuda.is_available())
    host.copy_(tensor)
    return tensor.device, host


def _unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, tuple):
        device, host = packed
        return host.to(device, non_blocking=True)
    return packed


def offload_activations(module: torch.nn.Module) -> torch.nn.Module:
    """Keep what ``module``'s forward saves for its backward in host memory (module docstring)."""
    if getattr(module, _HANDLES, None):
        return module  # already offloading: entering the hooks twice would copy nothing more
    open_: list[torch.autograd.graph.saved_tensors_hooks] = []

    def enter(mod: torch.nn.Module, args: Any) -> None:
        hooks = torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
        hooks.__enter__()
        open_.append(hooks)

    def leave(mod: torch.nn.Module, args: Any, output: Any) -> None:
        if open_:
            open_.pop().__exit__(None, None, None)

    setattr(module, _HANDLES, (module.register_forward_pre_hook(enter),
                               module.register_forward_hook(leave, always_call=True)))
    return module
