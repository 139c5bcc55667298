"""Placements of a tensor over one mesh axis, as in DTensor: ``S(dim)``, ``R``, ``P``.

A layout is one placement per mesh axis. "axis" is a mesh axis, "dim" a tensor dimension.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Shard:
    dim: int

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int):
            raise TypeError(f"Shard.dim must be an int, got {self.dim!r}")

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, slots=True)
class Replicate:
    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, slots=True)
class Partial:
    def __str__(self) -> str:
        return "P"


Placement = Shard | Replicate | Partial
_SHARD = re.compile(r"^S\((-?\d+)\)$")


def parse_placement(text: str) -> Placement:
    """Inverse of ``str(placement)``: ``"S(0)"``, ``"R"`` or ``"P"``."""
    if text == "R":
        return Replicate()
    if text == "P":
        return Partial()
    match = _SHARD.match(text)
    if match is None:
        raise ValueError(f"placement {text!r} is not one of S(dim), R, P")
    return Shard(int(match.group(1)))


def shard_sizes(size: int, parts: int) -> tuple[int, ...]:
    """Sizes of ``parts`` chunks of a dimension of ``size``, as torch.chunk splits it."""
    if parts <= 0:
        raise ValueError(f"parts must be positive, got {parts}")
    chunk = -(-size // parts) if size else 0
    sizes = []
    left = size
    for _ in range(parts):
        take = min(chunk, left)
        sizes.append(take)
        left -= take
    return tuple(sizes)
