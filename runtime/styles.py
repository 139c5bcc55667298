"""Codegen's step values turned into torch objects: placements, tensor-parallel styles, op handles; and
``kept_ties``, which keeps a tied weight one parameter through ``parallelize_module``."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import reduce

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor import parallel as tp

from ..codegen import TPStyle, torch_call
from ..codegen.tp_plans import MESHPLAN_STYLES
from ..ir import parse_placement
from ..ir import InvalidPlanError
from ..ir import Replicate as IrReplicate


def placement(layout: str) -> Placement:
    """``"S(1)"`` -> ``Shard(1)``, ``"R"`` -> ``Replicate()`` (the module boundaries TP styles use)."""
    parsed = parse_placement(layout)
    return Replicate() if isinstance(parsed, IrReplicate) else Shard(parsed.dim)


class FeatureShardedNorm(tp.ParallelStyle):
    """A norm over the features of a column-parallel projection's output, which tp splits (OLMo 2's q_norm / k_norm
    over every head's q / k, a (heads * head_dim,) weight): each rank holds its features' part of the weight
    (``Shard(0)``, as ``ColwiseParallel`` splits the projection's rows), takes its input as the ``Shard(-1)``
    DTensor it is, so that DTensor reduces the norm's statistics (the mean of squares) over tp, one number a token,
    and hands the output back as its local features. The user's own norm code runs; its gradients are whole."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, self._shard_params, self._input, self._output)

    @staticmethod
    def _shard_params(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        _shard_own_params(module, mesh)

    @staticmethod
    def _input(module: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
        x, *rest = inputs
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [Shard(x.dim() - 1)], run_check=False)
        return (x, *rest)

    @staticmethod
    def _output(module: nn.Module, outputs: object, mesh: DeviceMesh) -> object:
        return outputs.to_local() if isinstance(outputs, DTensor) else outputs


class HeadShardedParams(tp.PrepareModuleInput):
    """Attention's own per-head parameters (GPT-OSS's sinks, (heads,)) split with its heads: each rank holds its
    heads' entries (``Shard(0)``, as ``ColwiseParallel`` splits q's rows), and while the attention runs it reads them
    as a plain local tensor (``to_local``, through which the gradient reaches the sharded parameter whole: each head's
    entry touches only its own head). Its input is prepared as ``PrepareModuleInput``'s where layouts are given (under
    sequence parallelism). The parameters are swapped back after the forward, even one that raised."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if self.input_layouts is not None or self.input_kwarg_layouts:
            super()._apply(module, device_mesh)
        _shard_own_params(module, device_mesh)
        module.register_forward_pre_hook(_local_params)
        module.register_forward_hook(_sharded_params, always_call=True)
        return module


def _shard_own_params(module: nn.Module, mesh: DeviceMesh) -> None:
    """Each parameter ``module`` holds itself (not its submodules') as a ``Shard(0)`` DTensor over ``mesh``."""
    for key, param in list(module.named_parameters(recurse=False)):
        module.register_parameter(key, nn.Parameter(distribute_tensor(param, mesh, [Shard(0)]),
                                                    requires_grad=param.requires_grad))


def _local_params(module: nn.Module, args: tuple) -> None:
    module._meshplan_sharded = {k: p for k, p in module._parameters.items() if isinstance(p, DTensor)}
    for key, param in module._meshplan_sharded.items():
        module._parameters[key] = param.to_local()  # a view the backward maps onto the sharded parameter


def _sharded_params(module: nn.Module, args: tuple, output: object) -> None:
    module._parameters.update(getattr(module, "_meshplan_sharded", {}))
    module._meshplan_sharded = {}


def parallel_style(style: TPStyle) -> tp.ParallelStyle:
    """The ``torch.distributed.tensor.parallel`` style object for ``style`` (codegen's table says which), or
    meshplan's own (``FeatureShardedNorm``, ``HeadShardedParams``)."""
    cls_name, kwargs = torch_call(style)
    built = {key: value if isinstance(value, (bool, int))
             else {k: placement(v) for k, v in value.items()} if isinstance(value, dict)
             else tuple(placement(v) for v in value) if isinstance(value, tuple) else placement(value)
             for key, value in kwargs}
    return (_OWN_STYLES.get(cls_name) or getattr(tp, cls_name))(**built)


# the styles codegen names as meshplan's own (MESHPLAN_STYLES), which an emitted script imports from this module
_OWN_STYLES = {name: globals()[name] for name in MESHPLAN_STYLES}


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

