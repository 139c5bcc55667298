"""Execute a plan's Program on a real process group: shard a model in-process and train it.

``apply(plan, model)`` runs the same steps (``codegen.lower``) that ``codegen.emit_source`` prints
as a script; ``PlannedModule.step`` runs the same training step. Only this package touches process
groups, devices and environment variables.
"""
from .distributed import device_for_rank, init_distributed
from .interpret import EXECUTORS, execute
from .planned import PlannedModule, apply, default_optimizer, token_cross_entropy


def __getattr__(name: str):
    # train.py is also run as ``python -m meshplan.runtime.train``: importing it here eagerly would
    # make runpy warn that the module was imported before it ran.
    if name in ("run_training", "synthetic_batch"):
        from . import train

        return getattr(train, name)
    raise AttributeError(f"module 'meshplan.runtime' has no attribute {name!r}")


__all__ = ["EXECUTORS", "PlannedModule", "apply", "default_optimizer", "device_for_rank", "execute",
           "init_distributed", "run_training", "synthetic_batch", "token_cross_entropy"]
