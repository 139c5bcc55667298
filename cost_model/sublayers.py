"""Sublayers a plan keeps whole over tp: the intra-op program (``solver/intra_op.py``) may leave a
block's attention or MLP replicated inside a tensor-parallel group (codegen runs its linears as plain
modules on the whole stream). The cost model prices such a sublayer at tp = 1: its compute by its
share of the layer's forward FLOPs (``estimate``), its parameters whole on every tp rank
(``data_parallel.rank_params``), and the layer's activations as if nothing were split (``footprint``:
conservative, never under).
"""
from __future__ import annotations

from ..ir.graph import ModelDims
from ..ir.structure import ModelStructure
from ..ir.plan import AXES, Plan
from .flops import attention_core_flops, attention_params, dense_mlp_params, kv_width, layer_matmul_params

SUBLAYER_FIRST_LINEARS = {"attn": ("attn.wq",), "mlp": ("mlp.fc1", "mlp.w1")}  # the zoo's modules


def replicated_sublayers(plan: Plan) -> frozenset[str]:
    """The block sublayers (``attn``, dense ``mlp``) the plan keeps whole over tp: those whose first linear
    ``param_layouts`` (the solver's intra-op program) places ``R``, and, on a model run on its own modules
    (``plan.structure``), those tensor parallelism cannot split at all (``ModelStructure.tp_linears``: GPT-2's
    Conv1D, a fused q/k/v projection), whatever the layouts say; the first linears are read at the model's own
    paths (the zoo's ``SUBLAYER_FIRST_LINEARS`` for a plan without a structure).
    Every block of a kind is decided once, so the first block's placements stand for all."""
    if plan.mesh.tp <= 1:
        return frozenset()
    tp = AXES.index("tp")

    def whole(name: str) -> bool:
        return bool(plan.param_layouts) and plan.param_layouts.get(name, ("",) * len(AXES))[tp] == "R"

    s = own_structure(plan)
    if s is None:
        return frozenset(sub for sub, linears in SUBLAYER_FIRST_LINEARS.items() for linear in linears
                         if whole(f"layers.0.{linear}.weight"))
    out = set()
    for sub, linears in s.tp_linears().items():
        if linears is None:  # kept whole by the runtime: attention, or an MLP that is not experts
            if getattr(s, sub) and (sub == "attn" or not s.experts):
                out.add(sub)
        elif whole(f"{s.block_path(0)}.{linears[0][0]}.weight"):
            out.add(sub)
    return frozenset(out)


def own_structure(plan: Plan) -> ModelStructure | None:
    """``plan.structure`` as a ``ModelStructure``; None for a plan without one."""
    if not plan.structure:
        return None
    seen = _STRUCTURES.get(id(plan.structure))
    if seen is None or seen[0] is not plan.structure:  # the search's candidates share one structure dict
        if len(_STRUCTURES) > 64:
            _STRUCTURES.clear()
        seen = _STRUCTURES[id(plan.structure)] = (plan.structure, ModelStructure.from_dict(plan.structure))
    return seen[1]


_STRUCTURES: dict[int, tuple[dict, ModelStructure]] = {}  # id -> (the dict, kept alive, its structure)


def sublayer_shares(dims: ModelDims, seq_len: int) -> dict[str, tuple[float, float]]:
    """Per sublayer: (its share of the layer's forward FLOPs, its parameters per layer)."""
    h, kv = dims.hidden, kv_width(dims)
    attn_mm = 2 * h * h + 2 * h * kv
    attn_f = 2.0 * seq_len * attn_mm + attention_core_flops(dims, 1, seq_len)
    mlp_f = 2.0 * seq_len * (layer_matmul_params(dims) - attn_mm)
    return {"attn": (attn_f / (attn_f + mlp_f), attention_params(dims)),
            "mlp": (mlp_f / (attn_f + mlp_f), dense_mlp_params(dims))}


def replicated_params(plan: Plan, dims: ModelDims) -> float:
    """Parameters per layer that ``plan`` keeps whole over tp (0 when every sublayer is split)."""
    return sum(sublayer_shares(dims, plan.seq_len)[sub][1] for sub in replicated_sublayers(plan))


def norm_reductions(plan: Plan, replicated: frozenset[str]) -> int:
    """All-reduces over tp of one forward (and as many in the backward) that a block's attention adds when tp splits
    it: one per norm over a projection's split output (``ModelStructure.feature_norms``: OLMo 2's q_norm and
    k_norm, whose mean of squares each rank has a part of; ``runtime.styles.FeatureShardedNorm``), 4 bytes a
    token each. 0 without tp or where attention is kept whole (in ``replicated``: ``replicated_sublayers(plan)``)."""
    s = own_structure(plan)
    if plan.mesh.tp <= 1 or s is None or not s.feature_norms or "attn" in replicated:
        return 0
    return len(s.feature_norms)
