"""Parameter layouts a plan implies: one placement per mesh axis (pp, dp, cp, tp, ep), kept as data.

The tensor-parallel rules follow Megatron-LM (Shoeybi et al. 2019, sec. 3): the first matmul of
each pair is split by output features (``nn.Linear`` weight dim 0, ``S(0)``), the second by input
features (``S(1)``), so each pair needs one all-reduce (or, with sequence parallelism, one
all-gather and one reduce-scatter). Under ZeRO-3/FSDP2 every parameter is also split along dim 0
over dp.
"""
from __future__ import annotations

import fnmatch
from functools import lru_cache

from ..ir import AXES

# (pattern on the parameter name, tp placement); first match wins
TP_RULES: tuple[tuple[str, str], ...] = (
    ("*.attn.w[qkv].weight", "S(0)"), ("*.attn.w[qkv].bias", "S(0)"),
    ("*.attn.wo.weight", "S(1)"), ("*.attn.wo.bias", "R"),
    ("*.mlp.fc1.weight", "S(0)"), ("*.mlp.fc1.bias", "S(0)"),
    ("*.mlp.fc2.weight", "S(1)"), ("*.mlp.fc2.bias", "R"),
    ("*.mlp.w[13].weight", "S(0)"), ("*.mlp.w2.weight", "S(1)"),
    ("output.weight", "S(0)"),
    ("*", "R"),  # norms, embeddings (replicated over tp), routers, experts
)


@lru_cache(maxsize=65536)
def tp_placement(name: str) -> str:
    return next(p for pattern, p in TP_RULES if fnmatch.fnmatchcase(name, pattern))


def param_layouts(param_names: tuple[str, ...], *, tp: int, zero: int, dp: int) -> dict[str, tuple[str, ...]]:
    """Placements per axis of ``AXES`` for every parameter."""
    out = {}
    for name in param_names:
        per_axis = {axis: "R" for axis in AXES}
        if tp > 1:
            per_axis["tp"] = tp_placement(name)
        if zero == 3 and dp > 1:
            per_axis["dp"] = "S(0)"
        out[name] = tuple(per_axis[a] for a in AXES)
    return out
