"""What the exporters share: refusing a plan with every missing feature named, and reading the
plan's per-layer recomputation as one setting."""
from __future__ import annotations

from ..ir import InvalidPlanError, Plan, Recompute


def refuse(target: str, missing: list[str]) -> None:
    """Raise when ``missing`` names features ``target`` cannot express (one message naming all)."""
    if missing:
        raise InvalidPlanError(
            f"{target} cannot run this plan: " + "; ".join(missing)
            + f". Re-plan with these choices pinned (e.g. meshplan plan --schedule/--zero/--sp) or export to "
              "another framework")


def recompute_kinds(plan: Plan) -> set[Recompute]:
    return set(plan.recompute) or {Recompute.NONE}


def full_every_nth(plan: Plan) -> int | None:
    """n when exactly every n-th layer (layers n-1, 2n-1, ...) is fully recomputed and the rest are not;
    None otherwise. torchtitan's selective_ac_option 'n' checkpoints every n-th block this way."""
    full = [i for i, r in enumerate(plan.recompute) if r == Recompute.FULL]
    if not full or recompute_kinds(plan) != {Recompute.NONE, Recompute.FULL}:
        return None
    n = full[0] + 1
    return n if full == list(range(n - 1, plan.layers, n)) else None


def layer_counts(plan: Plan) -> list[int]:
    """Layers per pipeline chunk, chunk c on pipeline rank c % pp (the plan's placement)."""
    return [last - first for first, last in plan.stages] if plan.stages else [plan.layers]
