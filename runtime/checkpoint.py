"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP) that load under another plan.

A checkpoint is one DCP directory holding one flat state dict (DCP joins nested keys with "."):

    model.<fqn>                      the parameters, as this plan shards them (DTensor under FSDP2 or
                                     TP, plain tensors under DDP), named as in the unwrapped model
    optim.state.<fqn>.<key>          the optimizer state of each parameter, in the same layout
    optim.param_groups.<fqn>.<key>   the hyper-parameters of each parameter's group (lr, betas, ...)
    train.step                       optimizer steps done: the data position (``synthetic_batch``
                                     is a function of seed and step)
    train.data.position              with a token file (``data.py``): the windows read so far, from
                                     which a resumed run reads on
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

Expert parallelism keeps ``E / ep`` experts per rank under the whole model's names (a plain tensor,
or FSDP's DTensor over edp, of shape ``(E / ep, ...)``). For DCP they are shown as what they are:
a DTensor of all ``E`` experts over a mesh ``(ep, *their own mesh)`` placed ``(Shard(0), *their own
placements)`` (DTensor nests shards of the same dim left to right: the ep rank picks its block of
experts, FSDP its rows within it). The view shares the parameter's storage, so ``dcp.load`` fills
the parameter itself; an EP checkpoint loads under any plan, with or without ep, and back.

Every checkpoint ends with a manifest of its files' sizes and CRC-32s (``manifest.py``): a directory
without one is incomplete, and a load verifies every file before reading any tensor.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor, Shard

from ..ir import PlanError
from .expert import ExpertParallelMixin
from .manifest import MANIFEST_FILE, read_manifest, verify, write_manifest

if TYPE_CHECKING:
    from .planned import PlannedModule

OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
METADATA_FILE = ".metadata"  # DCP's index of the chunks every rank wrote
SHOWN = 5  # mismatched names listed in an error


class CheckpointError(PlanError):
    """A checkpoint is missing, incomplete, damaged, or from another model than the one loading it."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint is incomplete (no valid manifest) or a file differs from what was written: an
    older checkpoint may still be good (``resume`` falls back to it)."""


def save_checkpoint(pm: PlannedModule, path: str | os.PathLike, *, step: int, data_position: int | None = None) -> None:
    """Write ``pm``'s model and optimizer state, ``step``, the token file's ``data_position`` (if one is
    read) and the RNG states to the DCP directory ``path``. A collective: call it on every rank, with the
    same path (on a shared file system)."""
    model_sd, optim_sd = _state_dicts(pm)
    _show_experts_whole(pm, model_sd, optim_sd)
    state = {"model": model_sd, "optim": optim_sd, "train": {"step": step, "rng": {str(_rank()): _rng_state()}}}
    if data_position is not None:
        state["train"]["data"] = {"position": int(data_position)}
    dcp.save(state, checkpoint_id=str(path))
    write_manifest(path, step=step)


def load_checkpoint(pm: PlannedModule, path: str | os.PathLike) -> int:
    """Load a checkpoint written by ``save_checkpoint`` under any plan of the same model into ``pm``
    (resharding as ``pm``'s plan needs); returns the step it was saved at. A collective.
    ``load_training_state`` also returns the data position."""
    return load_training_state(pm, path)[0]


def load_training_state(pm: PlannedModule, path: str | os.PathLike) -> tuple[int, int | None]:
    """``load_checkpoint``, returning ``(step, data position)``; the position is None in a checkpoint of
    a run on synthetic tokens.

    Raises ``DamagedCheckpointError`` if ``path`` holds no complete checkpoint or one of its files
    differs from what was written (naming it), and ``CheckpointError`` if the checkpoint's
    parameters differ from the model's (naming each one, with both shapes)."""
    saved = _read_metadata(Path(path))
    model_sd, optim_sd = _state_dicts(pm)
    originals = _show_experts_whole(pm, model_sd, optim_sd)
    check_model_matches(_global_shapes(model_sd), saved, path)
    rng_key = str(_rank()) if f"train.rng.{_rank()}.cpu" in saved else "0"  # a new rank takes rank 0's
    rng = {kind: t for kind, t in _rng_state().items() if f"train.rng.{rng_key}.{kind}" in saved}
    read_as = _tied_optimizer_keys(pm.module, optim_sd, saved)
    optim_read = {read_as.get(key, key): value for key, value in optim_sd.items()}
    state = {"model": model_sd, "optim": optim_read, "train": {"step": 0, "rng": {rng_key: rng}}}
    if "train.data.position" in saved:
        state["train"]["data"] = {"position": 0}
    try:
        dcp.load(state, checkpoint_id=str(path))
    except dcp.api.CheckpointException as exc:  # raised on every rank, with every rank's failure
        raise DamagedCheckpointError(f"the checkpoint {path} verified but cannot be read: {_first_line(exc)}; "
                                     "an older checkpoint may load") from exc
    # tensors were filled in place; a scalar (a param group's lr) was set in optim_read only
    optim_sd.update({key: optim_read[read_as.get(key, key)] for key in optim_sd})
    for sd, entries in zip((model_sd, optim_sd), originals):
        sd.update(entries)  # the parameters themselves, which the views above filled
    set_state_dict(pm.module, _local_optimizer(pm.optimizer), model_state_dict=model_sd,
                   optim_state_dict=optim_sd, options=OPTIONS)
    _sync_zero_param_groups(pm.optimizer)
    _set_rng_state(state["train"]["rng"][rng_key])
    data = state["train"].get("data")
    return int(state["train"]["step"]), None if data is None else int(data["position"])


def _tied_optimizer_keys(module: nn.Module, optim_sd: dict[str, Any], saved: dict[str, Any]) -> dict[str, str]:
    """Optimizer entries of a tied head's copy on a pipeline's last stage (``LocalStages.tied_copies``) that the
    checkpoint holds under the embedding's name only (a plan without pp steps the tied weight once, under its
    first name) -> the key they are read from: the copy starts from the state of the weight it copies."""
    read_as = {}
    for copy, first in getattr(module, "tied_copies", {}).items():
        for key in optim_sd:
            for head in ("state.", "param_groups."):
                if key.startswith(f"{head}{copy}."):
                    other = f"{head}{first}.{key[len(head) + len(copy) + 1:]}"
                    if f"optim.{key}" not in saved and f"optim.{other}" in saved:
                        read_as[key] = other
    return read_as


def is_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a checkpoint every rank finished writing (it has a valid manifest)."""
    return read_manifest(path) is not None


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


def _show_experts_whole(pm: PlannedModule, model_sd: dict[str, Any], optim_sd: dict[str, Any]
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Replace each expert-parallel entry of the two state dicts (a parameter of ``E / ep`` experts and
    its optimizer state) by a view of all ``E`` experts (the module docstring); return the replaced
    entries of each, to put back once a load has filled them."""
    originals: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    meshes: dict[tuple, DeviceMesh] = {}
    for fqn, group in _expert_parameters(pm, model_sd).items():
        param = model_sd[fqn]
        entries = [(model_sd, originals[0], fqn)]
        entries += [(optim_sd, originals[1], key) for key, value in optim_sd.items()
                    if key.startswith(f"state.{fqn}.") and isinstance(value, torch.Tensor)
                    and isinstance(value, DTensor) == isinstance(param, DTensor) and value.shape == param.shape]
        for sd, kept, key in entries:
            kept[key] = sd[key]
            sd[key] = _over_ep(sd[key], group, meshes)
    return originals


def _expert_parameters(pm: PlannedModule, model_sd: dict[str, Any]) -> dict[str, dist.ProcessGroup]:
    """State-dict name -> ep group of every parameter split over ep."""
    found = {}
    for name, module in pm.module.named_modules():
        if not isinstance(module, ExpertParallelMixin):
            continue
        for pname, _ in module.named_parameters(recurse=False):
            fqn = f"{name}.{pname}".replace("_checkpoint_wrapped_module.", "")
            fqn = fqn if fqn in model_sd else fqn.removeprefix("module.")  # DDP's wrapper
            if fqn not in model_sd:
                raise CheckpointError(f"the expert parameter '{name}.{pname}' has no entry in the model's state "
                                      "dict; checkpoints of this plan cannot be written")
            found[fqn] = module.ep_group
    return found


def _over_ep(tensor: torch.Tensor, ep_group: dist.ProcessGroup, meshes: dict[tuple, DeviceMesh]) -> DTensor:
    """``tensor`` (this ep rank's ``E / ep`` experts, plain or a DTensor) as a DTensor of all ``E``
    experts over the mesh ``(ep, *tensor's mesh)``, sharing ``tensor``'s storage."""
    inner = tensor.device_mesh if isinstance(tensor, DTensor) else None
    key = (ep_group.group_name, None if inner is None else (tuple(inner.mesh.flatten().tolist()), inner.mesh_dim_names))
    if key not in meshes:
        meshes[key] = _ep_mesh(ep_group, inner, tensor.device.type)
    placements = (Shard(0), *(tensor.placements if inner is not None else ()))
    local = tensor.to_local() if inner is not None else tensor
    shape = (tensor.shape[0] * ep_group.size(), *tensor.shape[1:])
    with torch.no_grad():
        return DTensor.from_local(local.detach(), meshes[key], placements, run_check=False, shape=torch.Size(shape),
                                  stride=torch.empty(shape, device="meta").stride())


def _ep_mesh(ep_group: dist.ProcessGroup, inner: DeviceMesh | None, device_type: str) -> DeviceMesh:
    """The mesh ``(ep, *inner)`` over existing groups: the ranks that hold the other experts in the
    same position of ``inner`` (meshes are rank grids, so ep rank j's grid is this one shifted)."""
    me = dist.get_rank()
    inner_ranks = inner.mesh if inner is not None else torch.tensor(me)
    ranks = torch.stack([inner_ranks + (r - me) for r in dist.get_process_group_ranks(ep_group)])
    if len(set(ranks.flatten().tolist())) != ranks.numel():
        raise CheckpointError(f"the expert mesh {ranks.tolist()} repeats a rank: the ep groups and the experts' "
                              "FSDP mesh do not form a grid; checkpoints of this plan cannot be written")
    groups, names = [ep_group], ["ep"]
    if inner is not None:
        groups += inner.get_all_groups()
        names += inner.mesh_dim_names or [f"dim{i}" for i in range(inner.ndim)]
    return DeviceMesh.from_group(groups, device_type, mesh=ranks, mesh_dim_names=tuple(f"ckpt_{n}" for n in names))


def _shape(shape: Any) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ")"


def _read_metadata(path: Path) -> dict[str, Any]:
    """DCP's metadata, once every file is verified against the manifest (a collective)."""
    if not path.exists():
        raise CheckpointError(f"no complete checkpoint at {path}: the directory does not exist; "
                              "give a directory written by PlannedModule.save")
    manifest = read_manifest(path)
    if manifest is None:
        raise DamagedCheckpointError(f"no complete checkpoint at {path}: the directory has no valid {MANIFEST_FILE} "
                                     "(an unfinished save, or not written by PlannedModule.save)")
    problems = verify(path, manifest)
    if problems:
        more = f" (and {len(problems) - 1} more file(s))" if len(problems) > 1 else ""
        raise DamagedCheckpointError(f"the checkpoint {path} is damaged: {problems[0]}{more}; "
                                     "an older checkpoint may load")
    try:
        return dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as exc:  # noqa: BLE001 - verified bytes that still do not parse
        raise DamagedCheckpointError(f"the checkpoint {path} verified but its {METADATA_FILE} cannot be read: "
                                     f"{type(exc).__name__}: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


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
