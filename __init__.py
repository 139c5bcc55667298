"""meshplan: an automatic parallelization planner for training large models.

    plan = meshplan.autoparallelize(model, "h100-sxm:16x8", global_batch=1024, seq_len=8192)
    print(plan.report()); plan.save("p.json"); plan.emit("train.py")

The top-level names load lazily, so that ``import meshplan.ir`` stays cheap and pure.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Plan": "api", "autoparallelize": "api", "load": "api", "plans": "api",
    "Cluster": "cost_model",
    "InfeasibleError": "ir", "InvalidClusterError": "ir", "InvalidPlanError": "ir", "PlanError": "ir",
    "UnsupportedModelError": "ir",
}
__all__ = sorted(_LAZY) + ["ir", "zoo"]


def __getattr__(name: str) -> Any:
    if name in ("ir", "zoo"):
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'meshplan' has no attribute {name!r}")
