"""The values passed between meshplan's stages. Imports nothing but sympy."""
from .errors import (InfeasibleError, InvalidClusterError, InvalidPlanError, PlanError, UnknownModelError,
                     UnsupportedModelError)
from .graph import BATCH, DTYPE_BYTES, SEQ, Block, Graph, ModelDims, Node, OpKind, Param, TensorMeta, evaluate
from .placement import Partial, Placement, Replicate, Shard, parse_placement, shard_sizes
from . import limits, report
from .plan import AXES, SCHEMA, Mesh, Plan, Prediction, Recompute, Schedule, SolverInfo
from .structure import ModelStructure

__all__ = [
    "AXES", "BATCH", "DTYPE_BYTES", "SCHEMA", "SEQ", "Block", "Graph", "InfeasibleError", "InvalidClusterError",
    "InvalidPlanError", "Mesh", "ModelDims", "ModelStructure", "Node", "OpKind", "Param", "Partial", "Placement", "Plan", "PlanError",
    "Prediction", "Recompute", "Replicate", "Schedule", "Shard", "SolverInfo", "TensorMeta", "UnknownModelError",
    "UnsupportedModelError", "evaluate", "limits", "parse_placement", "shard_sizes",
]
