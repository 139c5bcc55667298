"""Lowering a plan to a Program of parallelization steps, and printing it as a torchrun script.

``lower(plan)`` is the one lowering; ``emit_source`` (here) and ``meshplan.runtime.apply`` are its two
back ends. Pure: imports ``meshplan.ir`` and the standard library only (no torch).
"""
from .emit import EMITTERS, emit_source
from .lower import lower
from .program import (SELECTIVE_SAVE_OPS, STEP_KINDS, BuildMesh, DataParallel, FullyShard, Policy, Program,
                      Recompute, ShardOptimizer, SplitPipeline, Step, StyleKind, TensorParallel, TPStyle)
from .program import EXPERT_AXES, ExpertMesh, ExpertParallel, FuseKernel
from .program import ContextParallel, FlattenMesh
from .program import Autocast
from .tp_plans import torch_call

__all__ = ["EMITTERS", "SELECTIVE_SAVE_OPS", "STEP_KINDS", "BuildMesh", "DataParallel", "FullyShard", "Policy",
           "Program", "Recompute", "ShardOptimizer", "SplitPipeline", "Step", "StyleKind", "TPStyle", "TensorParallel", "emit_source",
           "lower", "torch_call", "EXPERT_AXES", "ExpertMesh", "ExpertParallel",
           "ContextParallel", "FlattenMesh", "FuseKernel", "Autocast"]
