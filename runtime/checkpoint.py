"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP) that load under another plan.

A checkpoint is one DCP directory holding one flat state dict (DCP joins nested keys with "."):

    model.<fqn>                      the parameters, as this plan shards them (DTensor under FSDP2 or
                                     TP, plain tensors under DDP), named as in the unwrapped model
    optim.state.<fqn>.<key>          the optimizer state of each parameter, in the same layout
    optim.param_groups.<fqn>.<key>   the hyper-parameters of each parameter's group (lr, betas, ...)
    train.step                       optimizer steps done: the data position (``synthetic_batch``
                                     is a function of seed and step)
    train.rng.<rank>.cpu             each rank's RNG state (``.cuda`` too on GPUs)

``get_state_dict`` strips the wrappers (DDP's ``module.``, checkpoint wrappers, FSDP2) from the
names, and ``flatten_optimizer_state_dict=True`` keys every optimizer value by its own parameter,
so DCP reshards on load: a checkpoint written under dp=4 with ZeRO-3 loads under dp=2 x tp=2,
each rank reading only the slices its new shards cover (DCP's planner intersects the saved chunks
with the requested ones).

ZeRO-1 (``ZeroRedundancyOptimizer``) is mapped rather than consolidated: each rank's local
optimizer (``.optim``) holds the state of the parameters it owns, over the model's own Parameter
objects, so its flattened state dict has the keys of those parameters only. Ranks write disjoint
keys whose union is exactly what a plain optimizer writes, and on load each rank reads the keys of
the parameters it owns under the new partition. No ``consolidate_state_dict`` (which gathers the
whole state on one rank) is needed, and ZeRO-1 checkpoints load under every other plan and back.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.optim import ZeroRedundancyOptimizer

from ..ir import PlanError

if TYPE_CHECKING:
    from .planned import PlannedModule

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
METADATA_FILE = ".metadata"  # DCP writes it last, after every rank's data: its presence means complete
SHOWN = 5  # mismatched names listed in an error


class CheckpointError(PlanError):
    """A checkpoint is missing, incomplete, or from another model than the one loading it."""


def save_checkpoint(pm: PlannedModule, path: str | os.PathLike, *, step: int) -> None:
    """Write ``pm``'s model and optimizer state, ``step`` and the RNG states to the DCP directory
    ``path``. A collective: call it on every rank, with the same path (on a shared file system)."""
    _check_supported(pm)
    model_sd, optim_sd = _state_dicts(pm)
    state = {"model": model_sd, "optim": optim_sd, "train": {"step": step, "rng": {str(_rank()): _rng_state()}}}
    dcp.save(state, checkpoint_id=str(path))


def load_checkpoint(pm: PlannedModule, path: str | os.PathLike) -> int:
    """Load a checkpoint written by ``save_checkpoint`` under any plan of the same model into ``pm``
    (resharding as ``pm``'s plan needs); returns the step it was saved at. A collective.

    Raises ``CheckpointError`` if ``path`` holds no complete checkpoint, or if the checkpoint's
    parameters differ from the model's (naming each one, with both shapes)."""
    _check_supported(pm)
    saved = _read_metadata(Path(path))
    model_sd, optim_sd = _state_dicts(pm)
    check_model_matches(_global_shapes(model_sd), saved, path)
    rng_key = str(_rank()) if f"train.rng.{_rank()}.cpu" in saved else "0"  # a new rank takes rank 0's
    rng = {kind: t for kind, t in _rng_state().items() if f"train.rng.{rng_key}.{kind}" in saved}
    state = {"model": model_sd, "optim": optim_sd, "train": {"step": 0, "rng": {rng_key: rng}}}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(pm.module, _local_optimizer(pm.optimizer), model_state_dict=model_sd,
                   optim_state_dict=optim_sd, options=OPTIONS)
    _sync_zero_param_groups(pm.optimizer)
    _set_rng_state(state["train"]["rng"][rng_key])
    return int(state["train"]["step"])


def is_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a checkpoint every rank finished writing."""
    return (Path(path) / METADATA_FILE).is_file()


def check_model_matches(model_shapes: dict[str, tuple[int, ...]], saved: dict[str, Any],
                        path: str | os.PathLike) -> None:
    """Raise ``CheckpointError`` naming every parameter whose global shape differs between the model
    (``model_shapes``: fqn -> shape) and the checkpoint's metadata (``saved``: key -> storage
    metadata), and every one that only one of them has."""
    saved_shapes = {key.removeprefix("model."): tuple(meta.size) for key, meta in saved.items()
                    if key.startswith("model.") and hasattr(meta, "size")}
    problems = []
    for name, shape in model_shapes.items():
        found = saved_shapes.get(name)
        if found is None:
            problems.append(f"'{name}' {_shape(shape)} is not in the checkpoint")
        elif found != shape:
            problems.append(f"'{name}' has shape {_shape(shape)} in the model but {_shape(found)} in the checkpoint")
    problems += [f"'{name}' {_shape(shape)} is in the checkpoint but not in the model"
                 for name, shape in saved_shapes.items() if name not in model_shapes]
    if problems:
        listed = "; ".join(problems[:SHOWN]) + (f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
        raise CheckpointError(f"the checkpoint {path} is from another model: {len(problems)} parameter(s) "
                              f"do not match: {listed}. Load it into the model it was saved from "
                              "(the plan's model config), under any plan")


def _global_shapes(model_sd: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """fqn -> global shape over every rank (a collective): under pipeline parallelism each rank
    holds only its stages, and every rank must reach the same verdict (or the others would wait in
    ``dcp.load`` for one that raised)."""
    local = {name: tuple(tensor.shape) for name, tensor in model_sd.items()}  # a DTensor's shape is global
    if not dist.is_initialized():
        return local
    parts: list[dict[str, tuple[int, ...]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    return {name: shape for part in parts for name, shape in part.items()}


def _check_supported(pm: PlannedModule) -> None:
    """Expert parallelism keeps ``E / ep`` experts per rank as plain tensors under the whole
    model's names, which DCP would take for whole tensors: refuse rather than write a wrong file."""
    split = sorted(name for name, module in pm.module.named_modules() if hasattr(module, "ep_group"))
    if split:
        raise CheckpointError(f"checkpoints of expert-parallel plans are not supported yet ({len(split)} experts "
                              f"module(s) split over ep, e.g. '{split[0]}'); save and load under plans with ep=1")


def _shape(shape: Any) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ")"


def _read_metadata(path: Path) -> dict[str, Any]:
    if not is_complete(path):
        what = "does not exist" if not path.exists() else f"has no {METADATA_FILE} (an unfinished save?)"
        raise CheckpointError(f"no complete checkpoint at {path}: the directory {what}; "
                              "give a directory written by PlannedModule.save")
    return dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata


def _local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose state this rank holds: ZeRO-1's local shard, or the optimizer itself."""
    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def _state_dicts(pm: PlannedModule) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, optimizer) state dicts keyed by unwrapped names; an optimizer that has not stepped yet
    gets its state initialized (a step with lr 0) so that ``dcp.load`` has tensors to fill."""
    return get_state_dict(pm.module, _local_optimizer(pm.optimizer), options=OPTIONS)


def _sync_zero_param_groups(optimizer: torch.optim.Optimizer) -> None:
    """ZeRO-1 copies its own param_groups' hyper-parameters onto the local optimizer before each
    step, so the loaded ones (now in the local optimizer) must go to ZeRO's groups too."""
    if not isinstance(optimizer, ZeroRedundancyOptimizer):
        return
    for mine, local in zip(optimizer.param_groups, optimizer.optim.param_groups):
        mine.update({key: value for key, value in local.items() if key != "params"})


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
