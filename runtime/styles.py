"""Codegen's step values turned into torch objects: placements, tensor-parallel styles, op handles; and
``kept_ties``, which keeps a tied weight one parameter through ``parallelize_module``."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import reduce

import torch
from torch import nn
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor import parallel as tp

from ..codegen import TPStyle, torch_call
from ..ir import parse_placement
from ..ir import InvalidPlanError
from ..ir import Replicate as IrReplicate


def placement(layout: str) -> Placement:
    """``"S(1)"`` -> ``Shard(1)``, ``"R"`` -> ``Replicate()`` (the module boundaries TP styles use)."""
    parsed = parse_placement(layout)
    return Replicate() if isinstance(parsed, IrReplicate) else Shard(parsed.dim)


def parallel_style(style: TPStyle) -> tp.ParallelStyle:
    """The ``torch.distributed.tensor.parallel`` style object for ``style`` (codegen's table says which)."""
    cls_name, kwargs = torch_call(style)
    built = {key: value if isinstance(value, (bool, int))
             else {k: placement(v) for k, v in value.items()} if isinstance(value, dict)
             else tuple(placement(v) for v in value) if isinstance(value, tuple) else placement(value)
             for key, value in kwargs}
    return getattr(tp, cls_name)(**built)


def torch_op(name: str) -> torch._ops.OpOverload:
    """``"aten.mm.default"`` -> ``torch.ops.aten.mm.default``."""
    return reduce(getattr, name.split("."), torch.ops)


@contextlib.contextmanager
def kept_ties(module: nn.Module) -> Iterator[None]:
    """Keep each weight ``module`` ties (a head tied to the token embedding) one parameter through the
    tensor-parallel styles applied inside: each style distributes the weight of the module it names into a
    parameter of its own, so a vocab-parallel embedding (``RowwiseParallel``: ``Shard(0)`` of its (vocab, h)
    table) and a vocab-parallel head (``ColwiseParallel``: ``Shard(0)`` of its (vocab, h) weight) come out as
    two equal tensors; after them the head holds the embedding's again, as Megatron-LM's output layer uses the
    vocab-parallel embedding's weight. A weight the styles left placed differently on its two holders is
    refused by name."""
    from .materialize import tied_parameters

    ties = tied_parameters(module)
    yield
    paths = {id(m): path for path, m in module.named_modules()}
    for holder, attr, owner, owner_attr in ties:
        name = f"{paths.get(id(holder), '?')}.{attr}".lstrip(".")
        mine, theirs = holder._parameters[attr], owner._parameters[owner_attr]
        if mine is theirs:
            continue
        if getattr(mine, "placements", None) != getattr(theirs, "placements", None) or mine.shape != theirs.shape:
            raise InvalidPlanError(f"tensor parallelism placed the tied weight {name!r} as "
                                   f"{getattr(mine, 'placements', 'a plain tensor')} on one holder and "
                                   f"{getattr(theirs, 'placements', 'a plain tensor')} on the other; a tied weight "
                                   "must be split alike for both (vocab-parallel embedding and head) or for neither")
        setattr(holder, attr, theirs)

