"""Whether a model's attention still computes attention when tensor parallelism splits its heads.

Under tp each rank's q, k and v projections return ``heads / tp`` heads (ColwiseParallel), and the
attention code reshapes what it gets. Llama's Hugging Face code reshapes by ``(*input_shape, -1,
head_dim)``: the head count follows the width it is given. OPT's reshapes by ``(bsz, -1, num_heads,
head_dim)`` with the model's whole head count: given half the width, ``-1`` takes half the sequence,
and attention runs over a sequence folded in two, with no error, and trains a different model. The
traced graph cannot tell the two apart (export resolves ``-1``), so this runs the first block's
attention as tp = 2 would: a meta copy of the model whose first block's q, k, v projections are half as
wide and whose output projection takes half the width, on an odd sequence length (a folded sequence
cannot be halved: the reshape fails) and compares every 4-D tensor the attention makes with the whole
model's: each must be the same or have its heads dim (1 or 2) halved, as a head split leaves it.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..ir import ModelStructure
from .export import meta_copy
from .inputs import is_huggingface

PROBE_SEQ = 7  # odd: a sequence folded by a fixed head count cannot be reshaped back


class _Shapes(TorchDispatchMode):
    """The shape of every 4-D tensor an op returns while ``active``."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.active:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dim() == 4:
                    self.shapes.append(tuple(t.shape))
        return out


def _narrowed(linear: nn.Linear, *, out: int = 1, inp: int = 1) -> nn.Linear:
    return nn.Linear(linear.in_features // inp, linear.out_features // out, bias=linear.bias is not None,
                     device="meta", dtype=linear.weight.dtype)


def _halved_param(param: torch.Tensor) -> nn.Parameter:
    """A meta parameter with ``param``'s first dim halved, as ``Shard(0)`` over tp = 2 leaves it on a rank."""
    return nn.Parameter(torch.empty(param.shape[0] // 2, *param.shape[1:], dtype=param.dtype, device="meta"))


def _attention_shapes(model: nn.Module, s: ModelStructure, split: bool) -> list[tuple[int, ...]] | None:
    """The 4-D shapes the first block's attention makes on a meta copy (its heads halved when ``split``);
    None when that forward fails."""
    copy = meta_copy(model)
    block = copy.get_submodule(s.block_path(0))
    if split:
        for path in (s.q, s.k, s.v) if s.q else (s.qkv,):  # a grouped fused q/k/v (GPT-NeoX's) by its rows
            block.set_submodule(path, _narrowed(block.get_submodule(path), out=2))
        block.set_submodule(s.o, _narrowed(block.get_submodule(s.o), inp=2))
        for path in s.feature_norms:  # their weights split as the q / k features are (runtime.styles)
            norm = block.get_submodule(path)
            for name, param in list(norm.named_parameters(recurse=False)):
                norm.register_parameter(name, _halved_param(param))
        for path in s.head_params:  # GPT-OSS's sinks: a rank holds its heads' entries
            holder, _, name = path.rpartition(".")
            module = block.get_submodule(holder)
            module.register_parameter(name, _halved_param(getattr(module, name)))
    mode = _Shapes()
    attn = block.get_submodule(s.attn)
    # fake tensors: Hugging Face's mask code skips its value checks (.item()) when it sees one, as under export;
    # the forward stops where block 0's attention returns (``_Done``), before anything the probe does not need
    with _quiet_fake_tensors(), FakeTensorMode(allow_non_fake_inputs=True), _hooked(attn, mode), mode, \
            torch.no_grad():
        tokens = torch.zeros(1, PROBE_SEQ, dtype=torch.long, device="meta")
        try:
            if is_huggingface(copy):
                copy(input_ids=tokens, use_cache=False)
            else:
                copy(tokens)
        except _Done:
            return mode.shapes
        except Exception:  # noqa: BLE001 - a reshape that cannot take half the heads is the answer
            return None
    return None  # the attention never ran


class _Done(Exception):
    """Raised where block 0's attention returns: the probe has what it needs."""


@contextlib.contextmanager
def _quiet_fake_tensors() -> Iterator[None]:
    """FakeTensorMode logs an op that fails on meta at ERROR before raising it; here failing is an answer."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _hooked(module: nn.Module, mode: _Shapes) -> Iterator[None]:
    def enter(*_: object) -> None:
        mode.active = True

    def leave(*_: object) -> None:
        mode.active = False
        raise _Done

    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _halved(whole: tuple[int, ...], split: tuple[int, ...]) -> bool:
    """``split`` is ``whole`` with its heads dim (1, or 2 before the heads move forward) halved, or the same."""
    if whole == split:
        return True
    differ = [i for i, (a, b) in enumerate(zip(whole, split)) if a != b]
    if len(whole) != len(split) or len(differ) != 1:
        return False
    i = differ[0]
    return i in (1, 2) and whole[i] == 2 * split[i]


def heads_split_cleanly(model: nn.Module, s: ModelStructure) -> bool:
    """Whether splitting the first block's heads over two ranks leaves its attention computing attention
    (module docstring). True where there is nothing to check: no separate q/k/v/o, or a head count tp = 2
    cannot halve (the search offers no such tp), or a first forward that fails whole (a model that needs
    inputs of its own: its trace already ran)."""
    if not s.attn_split or not s.attn:
        return True
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", 0) or 0
    kv = getattr(config, "num_key_value_heads", heads) or heads
    if heads % 2 or kv % 2:
        return True
    whole = _attention_shapes(model, s, split=False)
    if whole is None:
        return True
    split = _attention_shapes(model, s, split=True)
    return split is not None and len(split) == len(whole) and all(map(_halved, whole, split))
