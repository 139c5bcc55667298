"""Codegen's step values turned into torch objects: placements, tensor-parallel styles, op handles."""
from __future__ import annotations

from functools import reduce

import torch
from torch.distributed.tensor import Placement, Replicate, Shard
from torch.distributed.tensor import parallel as tp

from ..codegen import TPStyle, torch_call
from ..ir import parse_placement
from ..ir import Replicate as IrReplicate


def placement(layout: str) -> Placement:
    """``"S(1)"`` -> ``Shard(1)``, ``"R"`` -> ``Replicate()`` (the module boundaries TP styles use)."""
    parsed = parse_placement(layout)
    return Replicate() if isinstance(parsed, IrReplicate) else Shard(parsed.dim)


def parallel_style(style: TPStyle) -> tp.ParallelStyle:
    """The ``torch.distributed.tensor.parallel`` style object for ``style`` (codegen's table says which)."""
    cls_name, kwargs = torch_call(style)
    built = {key: value if isinstance(value, bool)
             else {k: placement(v) for k, v in value.items()} if isinstance(value, dict)
             else tuple(placement(v) for v in value) if isinstance(value, tuple) else placement(value)
             for key, value in kwargs}
    return getattr(tp, cls_name)(**built)


def torch_op(name: str) -> torch._ops.OpOverload:
    """``"aten.mm.default"`` -> ``torch.ops.aten.mm.default``."""
    return reduce(getattr, name.split("."), torch.ops)
