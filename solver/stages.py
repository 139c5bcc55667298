"""Pipeline stage boundaries: which layers each stage runs.

The output layer and loss sit on the last stage and cost, in FLOPs, ``2·h·V`` per token against a
layer's ``layer_forward_flops`` (for Llama 3 8B with its 128k vocabulary that is 2.4 layers), so
an even split makes the last stage the slowest and sets the pace of the whole pipeline
(Narayanan et al. 2021 sec. 3.2). We balance by water-filling: find the smallest load ``T`` such
that stages of ``n_i = floor(T - e_i)`` layers cover all ``L`` layers, where ``e_i`` is the extra
load of stage i in layer units (the output layer on the last stage). That minimizes
``max_i (n_i + e_i)`` exactly over integer ``n_i >= 1``.

With interleaving (``vp`` chunks per rank) chunk c runs on rank ``c mod pp``; the chunks are split
evenly, the earlier ones taking the remainder, and the last chunk gives up layers to the output.
"""
from __future__ import annotations

import math
from functools import lru_cache

from ..cost_model.flops import layer_forward_flops, logits_forward_flops
from ..ir import ModelDims


def output_extra_layers(dims: ModelDims) -> float:
    """The output layer's forward FLOPs in units of one layer's."""
    return logits_forward_flops(dims, 1, 1) / layer_forward_flops(dims, 1, 1)


def balanced(layers: int, extra: tuple[float, ...]) -> tuple[int, ...]:
    """Layers per stage minimizing the largest ``n_i + extra_i``, each stage at least one layer."""
    stages = len(extra)
    if layers < stages:
        raise ValueError(f"{layers} layers cannot fill {stages} stages")
    lo, hi = 1.0, layers + max(extra) + 1.0
    for _ in range(60):  # bisection on the load T
        mid = (lo + hi) / 2
        if sum(max(1, math.floor(mid - e)) for e in extra) >= layers:
            hi = mid
        else:
            lo = mid
    counts = [max(1, math.floor(hi - e)) for e in extra]
    surplus = sum(counts) - layers
    for i in sorted(range(stages), key=lambda i: -(counts[i] + extra[i])):  # trim the most loaded first
        while surplus and counts[i] > 1 and counts[i] + extra[i] >= max(c + e for c, e in zip(counts, extra)):
            counts[i] -= 1
            surplus -= 1
    for i in range(stages):
        while surplus and counts[i] > 1:
            counts[i] -= 1
            surplus -= 1
    return tuple(counts)


@lru_cache(maxsize=4096)
def stage_ranges(dims: ModelDims, pp: int, vp: int = 1) -> tuple[tuple[int, int], ...]:
    """``[first, last)`` layer ranges for ``pp * vp`` chunks; empty for no pipeline."""
    if pp == 1:
        return ()
    chunks = pp * vp
    if vp == 1:
        counts = balanced(dims.layers, (0.0,) * (pp - 1) + (output_extra_layers(dims),))
    else:
        base, rest = divmod(dims.layers, chunks)
        counts = tuple(base + (1 if c < rest else 0) for c in range(chunks))
    out, first = [], 0
    for n in counts:
        out.append((first, first + n))
        first += n
    return tuple(out)
