"""Parameter layouts a plan implies: one placement per mesh axis (pp, dp, cp, tp, ep), kept as data.

Inside a block the tp placements come from the intra-op program (``intra_op.py``): the search
passes its answer as ``tp_layouts``. On the zoo's blocks it recovers Megatron-LM's split (Shoeybi et
al. 2019, sec. 3): the first matmul of each pair split by output features (``nn.Linear`` weight
dim 0, ``S(0)``), the second by input features (``S(1)``), one all-reduce per pair (or, with
sequence parallelism, one all-gather and one reduce-scatter). ``TP_RULES`` writes that answer
down for where no graph is at hand (``meshplan estimate`` from a saved plan) and for the
parameters outside the blocks (embedding, output head); ``tests/solver/test_intra_op.py`` checks
that the program and the rules agree. Under ZeRO-3/FSDP2 every parameter is also split along dim 0
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


def structure_split(graph) -> dict[str, str]:
    """Megatron's split written on a model's own module paths (``graph.structure``): each block's q, k, v and MLP
    input linears ``S(0)`` (their biases too), its output linears ``S(1)``, what the runtime runs on a plan without
    layouts. For a block the intra-op program finds no split for (its attention's matmuls and softmax kept whole, as
    Gemma 2's eager attention is traced), where ``TP_RULES``, written for the zoo's names, would keep a Hugging Face
    model's every linear ``R``."""
    s = graph.structure
    if s is None:
        return {}
    pairs = [linears for linears in s.tp_linears().values() if linears is not None]
    out = {}
    for block in graph.blocks:
        for cols, row in pairs:
            for col in cols:
                out[f"{block.name}.{col}.weight"] = out[f"{block.name}.{col}.bias"] = "S(0)"
            out[f"{block.name}.{row}.weight"] = "S(1)"
    return out


def param_layouts(param_names: tuple[str, ...], *, tp: int, zero: int, dp: int,
                  tp_layouts: dict[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Placements per axis of ``AXES`` for every parameter; ``tp_layouts`` (the intra-op answer for
    the block parameters) wins over ``TP_RULES``."""
    out = {}
    tp_layouts = tp_layouts or {}
    for name in param_names:
        per_axis = {axis: "R" for axis in AXES}
        if tp > 1:
            per_axis["tp"] = tp_layouts.get(name) or tp_placement(name)
        if zero == 3 and dp > 1:
            per_axis["dp"] = "S(0)"
        out[name] = tuple(per_axis[a] for a in AXES)
    return out
