"""The structure a plan is lowered against: ``plan.structure`` (what the frontend found in the user's
model), read as an ``ir.ModelStructure``.

Plans written before plans carried a structure (schema ``meshplan.plan/1`` files from the zoo) hold
only the zoo config; for those the structure is the one every zoo model of that family has, written
here once (``LEGACY_ZOO``), so that old plan files keep lowering. New plans never take this path.
"""
from __future__ import annotations

from ..ir import InvalidPlanError, ModelStructure, Plan

_ZOO_COMMON = dict(blocks="layers", embed="embed.tok", final_norm="norm", head="output", attn="attn",
                   attn_norm="attn_norm", q="attn.wq", k="attn.wk", v="attn.wv", o="attn.wo", mlp="mlp",
                   mlp_norm="mlp_norm")
LEGACY_ZOO = {
    "gpt": dict(_ZOO_COMMON, pos_embed="embed.pos", mlp_in=("mlp.fc1",), mlp_out="mlp.fc2"),
    "llama": dict(_ZOO_COMMON, mlp_in=("mlp.w1", "mlp.w3"), mlp_out="mlp.w2"),
    "moe": dict(_ZOO_COMMON, experts="mlp.experts", router="mlp.router"),
}


def structure_of(plan: Plan) -> ModelStructure:
    """``plan.structure``; for a plan without one, the zoo family's (module docstring)."""
    if plan.structure:
        return ModelStructure.from_dict(plan.structure)
    family = plan.model.get("family")
    if family not in LEGACY_ZOO:
        raise InvalidPlanError(f"the plan has no structure (the module paths of the model's blocks and weights) "
                               f"and its model family {family!r} is not a zoo family {tuple(LEGACY_ZOO)}; "
                               "re-plan the model with this meshplan (meshplan plan ... -o FILE)")
    layers = plan.model.get("layers", len(plan.recompute))
    heads, hidden = plan.model.get("heads") or 1, plan.model.get("hidden") or 0
    return ModelStructure(num_blocks=int(layers), head_dim=int(hidden) // int(heads), **LEGACY_ZOO[family])


def pipeline_ready(s: ModelStructure) -> bool:
    """The stage module of ``runtime.pipeline`` runs ``embed -> blocks -> norm -> head`` on these paths:
    each a child of the root, and blocks that take and return the residual stream alone."""
    return bool(s == ModelStructure(**{**LEGACY_ZOO.get(_family(s), {}), "num_blocks": s.num_blocks,
                                       "head_dim": s.head_dim, "notes": s.notes}))


def _family(s: ModelStructure) -> str:
    if s.experts:
        return "moe"
    return "gpt" if s.pos_embed else "llama"


def zoo_family(s: ModelStructure) -> str | None:
    """The zoo family whose modules these are (their classes run context parallelism and fused kernels),
    or None for any other model."""
    family = _family(s)
    return family if pipeline_ready(s) else None
