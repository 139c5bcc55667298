"""Execute a Program's steps in-process: the runtime's back end, one executor per step kind.

``EXECUTORS`` mirrors ``codegen.emit.EMITTERS``; each executor makes the same public PyTorch call
the emitted script prints for that step, so ``plan.apply`` and the script shard alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..codegen import (Autocast, BuildMesh, ContextParallel, DataParallel, ExpertMesh, ExpertParallel, FlattenMesh, FullyShard,
                       FuseKernel, Policy, Program, Recompute, ShardOptimizer, SplitPipeline, Step, TensorParallel)
from ..codegen.expert import on_expert_mesh
from ..ir import InvalidPlanError
from .context import context_parallel_step, flatten_mesh
from .expert import build_expert_mesh, expert_parallel
from .fused import fuse_kernel
from .materialize import is_meta, materialize, meta_init_of
from .offload import offload_activations
from .pipeline import run_on_stages, split_pipeline
from .styles import kept_ties, parallel_style, torch_op


@dataclass
class State:
    """What the steps build up: the (possibly re-wrapped) root module, the mesh, the optimizer's needs."""

    model: nn.Module
    device: torch.device
    mesh: DeviceMesh | None = None
    zero1_axis: str | None = None  # set by ShardOptimizer: the optimizer is built sharded over this axis
    ddp: bool = False  # the root is a DistributedDataParallel wrapper
    pipeline: Any = None  # set by SplitPipeline: this rank's stages (runtime.pipeline.Pipeline)
    expert_mesh: DeviceMesh | None = None  # set by ExpertMesh: the same ranks with dp split into (edp, ep)

    def mesh_for(self, axes: tuple[str, ...]) -> DeviceMesh:
        """The mesh that names ``axes``: the expert mesh for its own axes (``on_expert_mesh``), else BuildMesh's."""
        return self.expert_mesh if on_expert_mesh(axes) else self.mesh

    def get(self, path: str) -> nn.Module:
        return self.model.get_submodule(path) if path else self.model

    def set(self, path: str, module: nn.Module) -> None:
        """Replace the module at ``path`` (a wrapper around it); ``""`` replaces the root."""
        if not path:
            self.model = module
            return
        parent, _, name = path.rpartition(".")
        setattr(self.get(parent), name, module)  # ModuleList children are named "0", "1", ...


def _build_mesh(step: BuildMesh, state: State) -> None:
    """Build the mesh, or check that the one the caller passed has the plan's axes and sizes."""
    if state.mesh is not None:
        given = tuple(zip(state.mesh.mesh_dim_names or (), state.mesh.shape))
        if given != step.dims:
            raise InvalidPlanError(f"the mesh passed to apply has axes {given} but the plan needs {step.dims}")
        return
    sizes = tuple(n for _, n in step.dims)
    state.mesh = init_device_mesh(state.device.type, sizes, mesh_dim_names=tuple(a for a, _ in step.dims))


def _tensor_parallel(step: TensorParallel, state: State) -> None:
    styles = {path: parallel_style(style) for path, style in step.plan}
    module = state.get(step.module)
    with kept_ties(module):  # a head tied to the embedding stays one weight, vocab-parallel for both
        parallelize_module(module, state.mesh[step.mesh_axis], styles)


def _keep_listed(save: frozenset, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE


def _recompute(step: Recompute, state: State) -> None:
    if step.policy == Policy.OFFLOAD:
        offload_activations(state.get(step.module))
        return
    extra: dict[str, Any] = {}
    if step.policy == Policy.SELECTIVE:
        policy = partial(_keep_listed, frozenset(torch_op(name) for name in step.save_ops))
        extra["context_fn"] = partial(create_selective_checkpoint_contexts, policy)
    wrapped = checkpoint_wrapper(state.get(step.module), checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra)
    state.set(step.module, wrapped)


def _fully_shard(step: FullyShard, state: State) -> None:
    axes = step.mesh_axes
    whole = state.mesh_for(axes)
    mesh = whole[axes[0]] if len(axes) == 1 else whole[axes]
    fully_shard(state.get(step.module), mesh=mesh, reshard_after_forward=step.reshard_after_forward,
                mp_policy=mixed_precision(step))


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else getattr(torch, name)


def mixed_precision(step: FullyShard) -> MixedPrecisionPolicy:
    """FSDP2's policy for the step: gathered parameters in ``param_dtype``, gradients reduced in
    ``reduce_dtype``; None leaves them fp32 (the default policy)."""
    return MixedPrecisionPolicy(param_dtype=_dtype(step.param_dtype), reduce_dtype=_dtype(step.reduce_dtype))


def _autocast(step: Autocast, state: State) -> None:
    """Compute the module's forward (and its recomputation) in ``step.dtype`` on fp32 parameters."""
    module = state.get(step.module)
    module.forward = torch.autocast(state.device.type, dtype=_dtype(step.dtype))(module.forward)


def _data_parallel(step: DataParallel, state: State) -> None:
    group = state.mesh[step.mesh_axis].get_group()
    # gradients live in DDP's all-reduce buckets instead of beside them: one copy of them, not two
    state.set(step.module, DistributedDataParallel(state.get(step.module), process_group=group,
                                                   gradient_as_bucket_view=True))
    state.ddp = state.ddp or step.module == ""


def _shard_optimizer(step: ShardOptimizer, state: State) -> None:
    state.zero1_axis = step.mesh_axis


EXECUTORS: dict[type, Callable[[Any, State], None]] = {
    BuildMesh: _build_mesh, SplitPipeline: split_pipeline, TensorParallel: _tensor_parallel, Recompute: _recompute,
    FullyShard: _fully_shard, DataParallel: _data_parallel, ShardOptimizer: _shard_optimizer,
    ExpertMesh: build_expert_mesh, ExpertParallel: expert_parallel,
    FlattenMesh: flatten_mesh, ContextParallel: context_parallel_step, FuseKernel: fuse_kernel, Autocast: _autocast,
}


# DistributedDataParallel broadcasts rank 0's weights when it wraps a module: they must be real by then
NEEDS_WEIGHTS = (DataParallel,)


def execute(program: Program, model: nn.Module, device: torch.device, *, mesh: DeviceMesh | None = None) -> State:
    """Run every step of ``program`` on ``model`` (in place where PyTorch shards in place).

    A model built on meta (``runtime.materialize.build_on_meta``) is split and sharded on meta, then
    materialized on ``device`` (this rank's shards only, filled with the one-process model's values)
    before the first step that needs real weights (``NEEDS_WEIGHTS``), or after the last step."""
    init = meta_init_of(model) if is_meta(model) else None
    state = State(model=model, device=device, mesh=mesh)
    for step in program.steps:
        if init is not None and isinstance(step, NEEDS_WEIGHTS):
            materialize(state.model, device, init)
            init = None
        run_step(step, state)
    if init is not None:
        materialize(state.model, device, init)
    return state


def run_step(step: Step, state: State) -> None:
    executor = EXECUTORS.get(type(step))
    if executor is None:
        raise NotImplementedError(f"the runtime has no executor for {type(step).__name__}")
    if state.pipeline is not None and hasattr(step, "module"):
        run_on_stages(step, state, executor)  # on the local stage(s) that hold step.module
        return
    executor(step, state)
