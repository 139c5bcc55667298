"""Sublayers a plan keeps whole over tp: the intra-op program (``solver/intra_op.py``) may leave a
block's attention or MLP replicated inside a tensor-parallel group (codegen runs its linears as plain
modules on the whole stream). The cost model prices such a sublayer at tp = 1: its compute by its
share of the layer's forward FLOPs (``estimate``), its parameters whole on every tp rank
(``data_parallel.rank_params``), and the layer's activations as if nothing were split (``footprint``:
conservative, never under).
"""
from __future__ import annotations

from ..ir.graph import ModelDims
from ..ir.plan import AXES, Plan
from .flops import attention_core_flops, attention_params, dense_mlp_params, kv_width, layer_matmul_params

SUBLAYER_FIRST_LINEARS = {"attn": ("attn.wq",), "mlp": ("mlp.fc1", "mlp.w1")}


def replicated_sublayers(plan: Plan) -> frozenset[str]:
    """The block sublayers (``attn``, dense ``mlp``) whose linears the plan keeps whole over tp
    (``param_layouts`` from the solver's intra-op program; codegen runs them as plain modules).
    Every block of a kind is decided once, so the first layer's placements stand for all."""
    if plan.mesh.tp <= 1 or not plan.param_layouts:
        return frozenset()
    tp = AXES.index("tp")
    return frozenset(sub for sub, linears in SUBLAYER_FIRST_LINEARS.items() for linear in linears
                     if plan.param_layouts.get(f"layers.0.{linear}.weight", ("",) * len(AXES))[tp] == "R")


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
