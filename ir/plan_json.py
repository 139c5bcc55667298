"""A plan read from JSON: validated against ``ir/schema.py`` (every field, and the rules that join them),
then turned into ``Plan`` arguments.

Only plain data is read (``readfile.parse_json``); nothing is imported or executed from the file.
"""
from __future__ import annotations

from typing import Any

from .schema import PlanFile, validate


def plan_kwargs_from_dict(data: Any, *, where: str) -> dict[str, Any]:
    """The ``Plan(**kwargs)`` of a parsed plan file; ``InvalidPlanError`` naming the field if it is not one."""
    from .plan import Mesh, Prediction, SolverInfo

    p: PlanFile = validate(data, where=where)
    kw: dict[str, Any] = {name: getattr(p, name) for name in (
        "cluster", "global_batch", "seq_len", "zero_stage", "zero_group", "sequence_parallel", "micro_batch_size",
        "num_microbatches", "schedule", "vp", "dtype", "software")}
    kw["model"] = _in_order(p.model.model_dump(exclude_unset=True), data["model"])
    kw["mesh"] = Mesh(**p.mesh.model_dump())
    kw["recompute"] = tuple(p.recompute)
    kw["stages"] = tuple((first, last) for first, last in p.stages)
    kw["param_layouts"] = {name: tuple(layout) for name, layout in p.param_layouts.items()}
    kw["fusions"] = tuple(p.fusions)
    kw["source"] = _in_order(p.source if isinstance(p.source, dict) else p.source.model_dump(exclude_unset=True, by_alias=True),
                             data.get("source", {}))
    kw["structure"] = _in_order(p.structure.model_dump(exclude_unset=True), data.get("structure", {}))
    if p.prediction is not None:
        kw["prediction"] = Prediction(**p.prediction.model_dump())
    if p.solver is not None:
        solver = p.solver.model_dump()
        solver["alternatives"] = tuple(solver["alternatives"])
        kw["solver"] = SolverInfo(**solver)
    return kw


def _in_order(dumped: dict[str, Any], original: dict[str, Any]) -> dict[str, Any]:
    """``dumped`` with the keys in the file's order, so that a plan saves back byte for byte."""
    return {key: dumped[key] for key in original}
