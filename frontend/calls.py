"""How a block hands the residual stream to each of its modules: as the first positional argument (the
zoo, torchtitan, nanoGPT: ``self.attn(self.ln_1(x))``) or by keyword (Hugging Face:
``self.self_attn(hidden_states=..., position_embeddings=...)``). Sequence parallelism gathers that one
input before attention (``PrepareModuleInput``), so it must know which it is.

It also notes whether the module returned a tuple (Hugging Face's attention returns ``(attn_output,
attn_weights)``, positional or not): a module kept whole under sequence parallelism has its output cut back
to the sequence slice by ``PrepareModuleInputOutput``, which takes one tensor (``returns_tuple``).

Recorded while export traces the model: forward hooks on every module of the first block note how the
module was called and what it returned (``recording``); they change nothing and are removed after the trace.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import torch
from torch import nn


@contextlib.contextmanager
def recording(model: nn.Module, under: str, seen: dict[str, str]) -> Iterator[None]:
    """While inside, each module at or below ``under`` records into ``seen`` (its path relative to
    ``under``) the keyword its first call passed a (b, s, h) tensor by, or "" when positional, and under
    its path + ``OUT`` "tuple" when that call returned a tuple."""
    handles = []
    if under:
        for path, module in model.named_modules():
            if path == under or path.startswith(under + "."):
                rel = path[len(under) + 1:]
                handles.append(module.register_forward_pre_hook(partial(_record, seen, rel), with_kwargs=True))
                handles.append(module.register_forward_hook(partial(_record_output, seen, rel)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _record(seen: dict[str, str], rel: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
    if rel in seen:
        return
    if args and isinstance(args[0], torch.Tensor):
        seen[rel] = ""
        return
    # the (b, s, h) activations: real 3-D tensors (Llama 4 passes its rotary table, complex (b, s, d/2), beside
    # them); of several, the one named hidden_states
    hidden = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.dim() == 3 and v.is_floating_point()]
    if len(hidden) > 1 and "hidden_states" in hidden:
        hidden = ["hidden_states"]
    seen[rel] = hidden[0] if len(hidden) == 1 else ""


OUT = ":out"  # ``seen[path + OUT]``: what the module's first call returned ("tuple"), beside its keyword


def _record_output(seen: dict[str, str], rel: str, module: nn.Module, args: tuple, output: object) -> None:
    seen.setdefault(rel + OUT, "tuple" if isinstance(output, tuple) else "")


def returns_tuple(seen: dict[str, str], path: str) -> bool:
    """Whether the module at ``path`` (relative to the first block) returned a tuple when traced."""
    return seen.get(path + OUT) == "tuple"
