"""Hybrid sharding (HSDP, ``plan.zero_group``): ZeRO-2/3 shards inside groups of ``zero_group``
consecutive data-parallel ranks (a node, or several: FSDP2 runs a shard group of 32 on 64 GPUs as
well as one of 8, the mesh does not care where nodes end) and replicates across the ``dp // zero_group``
groups. The mesh splits dp into ("dp", dp // zero_group) outer (replicate) and ("dp_shard",
zero_group) inner (shard, consecutive ranks), FSDP2 runs on mesh["dp", "dp_shard"] (HSDP: reduce-
scatter in the group, all-reduce of the shard across groups), and the two are flattened into one
axis ``DATA_AXIS`` that data loading and the loss average use: every dp rank sees other tokens.

Supported with tp; pp, cp and ep with ``zero_group`` raise InvalidPlanError for now.
"""
from __future__ import annotations

from types import ModuleType, SimpleNamespace

from ..ir import InvalidPlanError, Plan
from .program import FlattenMesh, Program, Step

DATA_AXIS = "dp_full"  # dp x dp_shard, flattened: the full data-parallel rank
SHARD_AXES = ("dp", "dp_shard")


def check_hybrid(plan: Plan) -> None:
    m = plan.mesh
    if not plan.zero_group:
        return
    for axis in ("pp", "cp", "ep"):
        if getattr(m, axis) > 1:
            raise InvalidPlanError(f"zero_group({plan.zero_group}) (hybrid sharding) with {axis}({getattr(m, axis)}) "
                                   "> 1 is not supported by the runtime yet; use zero_group 0 (shard over all of dp)")


def split_dp(plan: Plan, dims: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Replace ("dp", dp) with ("dp", dp // zero_group), ("dp_shard", zero_group): shard ranks innermost
    of dp (consecutive data ranks, one node), tp (and nothing else) inside them."""
    if not plan.zero_group:
        return dims
    g = plan.zero_group
    out: list[tuple[str, int]] = []
    for name, size in dims:
        out += [("dp", size // g), ("dp_shard", g)] if name == "dp" else [(name, size)]
    return out


def flatten_steps(plan: Plan) -> list[Step]:
    return [FlattenMesh(axes=SHARD_AXES, name=DATA_AXIS)] if plan.zero_group else []


def data_axis(plan: Plan, default: str) -> str:
    return DATA_AXIS if plan.zero_group else default


def script_parts(program: Program, parts: SimpleNamespace | ModuleType) -> SimpleNamespace | ModuleType:
    """The training loop takes its data rank and loss group from the flattened axis under HSDP."""
    if program.dp_axis != DATA_AXIS:
        return parts
    out = SimpleNamespace(**{name: getattr(parts, name) for name in dir(parts) if name.isupper()})
    old = 'dp_rank, dp_group = mesh.get_local_rank("dp"), mesh["dp"].get_group()'
    if old not in parts.LOOP:
        raise AssertionError(f"codegen.hybrid: the training loop no longer has {old!r}; update script_parts")
    out.LOOP = parts.LOOP.replace(old, f'dp_rank, dp_group = mesh["{DATA_AXIS}"].get_local_rank(), '
                                       f'mesh["{DATA_AXIS}"].get_group()  # HSDP: dp x dp_shard')
    return out
