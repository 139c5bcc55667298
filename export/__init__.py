"""Plans written as other frameworks run them: a torchtitan job config (TOML), Megatron-LM arguments,
a DeepSpeed config (JSON). Each exporter is a pure function ``Plan -> str`` that raises
``ir.InvalidPlanError`` naming every feature of the plan the target cannot express."""
from __future__ import annotations

from collections.abc import Callable

from ..ir import Plan
from .deepspeed import to_deepspeed
from .megatron import to_megatron
from .torchtitan import to_torchtitan

EXPORTERS: dict[str, Callable[[Plan], str]] = {
    "torchtitan": to_torchtitan, "megatron": to_megatron, "deepspeed": to_deepspeed}
SUFFIXES = {"torchtitan": ".toml", "megatron": ".args", "deepspeed": ".json"}


def export(plan: Plan, target: str) -> str:
    """``plan`` as ``target`` (a key of ``EXPORTERS``) reads it."""
    from ..ir import InvalidPlanError

    if target not in EXPORTERS:
        raise InvalidPlanError(f"export target {target!r} is not one of {sorted(EXPORTERS)}")
    return EXPORTERS[target](plan)


__all__ = ["EXPORTERS", "SUFFIXES", "export", "to_deepspeed", "to_megatron", "to_torchtitan"]
