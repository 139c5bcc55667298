"""Pretrained weights: a Hugging Face safetensors checkpoint into the sharded model, and back.

``load_pretrained(pm, DIR)`` reads the directory ``save_pretrained`` of transformers writes (one
``model.safetensors`` or several with their ``model.safetensors.index.json``) with DCP's
``HuggingFaceStorageReader``: the model's state dict (DTensor shards under TP/FSDP, this rank's
stages under pipeline parallelism, all experts as one DTensor over ep as ``checkpoint.py`` shows
them) is the load plan, so each rank reads only the slices it holds (safetensors' ``get_slice`` on a
memory map). Names are the model's own parameter names, which for a transformers model are the
checkpoint's. Before any tensor is read, the names and global shapes are compared (every rank gets
the same verdict) and the first difference is named. An emitted script, which holds the sharded
model but no ``PlannedModule``, calls ``load_pretrained_into(model, DIR)``: the same code.

``save_pretrained(pm, DIR)`` writes the same format with ``HuggingFaceStorageWriter``: every rank
writes its shards, the coordinator consolidates them into ``model-00001-of-0000N.safetensors`` and
the index (then the shards are removed), and rank 0 writes the model's ``config.json`` if it has a
transformers config: the directory loads with ``from_pretrained``. A tied weight (a head tied to the token
embedding) is written once, under its first name, as transformers writes it, and read into every holder.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import FSDPModule

from .checkpoint import SHOWN, CheckpointError, _global_shapes, _shape, _show_experts_whole
from .materialize import shared_names

if TYPE_CHECKING:
    from .planned import PlannedModule

SUFFIX = ".safetensors"
SHARDED = "sharded"  # HuggingFaceStorageWriter's folder of per-rank files before consolidation


def find_safetensors(path: str | os.PathLike) -> list[Path]:
    """The ``.safetensors`` files directly under the directory ``path``; raises ``CheckpointError`` if
    it does not exist or holds none."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"--init-from {root} is not a directory; give the directory a Hugging Face model was "
                              "saved to (model.save_pretrained(DIR) or PlannedModule.save_pretrained)")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(SUFFIX))
    if not files:
        raise CheckpointError(f"--init-from {root} holds no {SUFFIX} file; save the model with safetensors "
                              "(transformers' default) or convert its pytorch_model.bin")
    return files


def saved_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Name -> global shape of every tensor in the checkpoint directory ``path`` (headers only)."""
    find_safetensors(path)
    metadata = HuggingFaceStorageReader(str(path)).read_metadata().state_dict_metadata
    return {name: tuple(meta.size) for name, meta in metadata.items() if hasattr(meta, "size")}


def check_pretrained(model: Any, path: str | os.PathLike) -> None:
    """``check_names_and_shapes`` of a whole (unsharded, possibly meta) model against ``path``, in one
    process: what ``meshplan run`` checks before it starts any worker."""
    saved = saved_shapes(path)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name in tied_names(model, shapes, saved):
        del shapes[name]
    for name, stored in checkpoint_names(model, shapes, saved, path).items():
        shapes[stored] = shapes.pop(name)
    check_names_and_shapes(shapes, saved, path)


def checkpoint_names(model: Any, names: Collection[str], saved: Collection[str],
                     path: str | os.PathLike) -> dict[str, str]:
    """(model name -> checkpoint name) of the model's ``names`` that the checkpoint stores under the name
    transformers renames at load (its ``conversion_mapping``: GPT-NeoX's ``embed_out`` is the model's ``lm_head``,
    old checkpoints' ``LayerNorm.gamma`` a ``weight``), each rename applied as transformers applies it
    (``WeightRenaming.rename_source_key``, in order). A checkpoint transformers would *convert* (experts stored one
    by one, which it stacks into one fused tensor: Mixtral's, Qwen3-MoE's per-expert layout on the Hub) is refused
    with ``CheckpointError``: this loader reads each tensor into one parameter. {} for a model that is not a
    transformers model."""
    try:
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import (WeightRenaming, get_checkpoint_conversion_mapping,
                                                     get_model_conversion_mapping)
    except ImportError:  # transformers is optional: a user's own model names its tensors itself
        return {}
    model = _unwrapped(model)
    if not isinstance(model, PreTrainedModel):
        return {}
    transforms = get_model_conversion_mapping(model)
    if isinstance(model, FSDPModule):  # fully_shard made its class FSDP<Name>; transformers looks mappings up by name
        base = next(c for c in type(model).__mro__ if issubclass(c, PreTrainedModel) and not issubclass(c, FSDPModule))
        transforms = (get_checkpoint_conversion_mapping(base.__name__) or []) + transforms
    renames = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    wanted = set(names) - set(saved)
    out = {}
    for stored in saved:
        name = stored
        for rename in renames:
            name = rename.rename_source_key(name)[0]
        if name != stored and name in wanted:
            out[name] = stored
        elif stored not in names and (hit := next((c for c in converters if c.rename_source_key(name)[1]), None)):
            raise CheckpointError(
                f"the pretrained checkpoint {path} stores {stored!r} in the layout transformers converts at load "
                f"({type(hit).__name__} {list(hit.source_patterns)} -> {list(hit.target_patterns)}: tensors merged "
                "into one, as experts stored one by one are stacked); meshplan reads each checkpoint tensor into one "
                "parameter of the sharded model and does not convert; start from a checkpoint in the model's own "
                "layout (this package's save_pretrained writes one), or train from scratch")
    return out


def load_pretrained(pm: PlannedModule, path: str | os.PathLike) -> None:
    """Fill ``pm``'s parameters from the Hugging Face checkpoint directory ``path``, each rank reading
    what it holds. A collective. Raises ``CheckpointError`` naming the first parameter whose name or
    shape differs, before any tensor is read."""
    load_pretrained_into(pm.module, path)


def load_pretrained_into(module: nn.Module, path: str | os.PathLike) -> None:
    """``load_pretrained`` of the sharded, materialized model alone: what an emitted script holds
    (it has no ``PlannedModule``). A collective."""
    saved = saved_shapes(path)
    reader = HuggingFaceStorageReader(str(path))
    model_sd = get_model_state_dict(module)
    # _show_experts_whole reads only the sharded module of a PlannedModule
    originals, _ = _show_experts_whole(SimpleNamespace(module=module), model_sd, {})
    load_sd = dict(model_sd)
    for name, first in tied_names(module, model_sd, saved).items():  # DCP fills in place: model_sd sees it
        tensor = load_sd.pop(name)
        load_sd.setdefault(first, tensor)
    for name, stored in checkpoint_names(module, load_sd, saved, path).items():  # GPT-NeoX's embed_out
        load_sd[stored] = load_sd.pop(name)
    check_names_and_shapes(_global_shapes(load_sd), saved, path)
    dcp.load(load_sd, storage_reader=reader)
    model_sd.update(originals)  # the expert parameters themselves, which the views above filled
    set_model_state_dict(module, model_sd)


def tied_names(module: nn.Module, names: Collection[str], saved: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """(other name -> first name) of each tied weight among the model's ``names`` that the checkpoint holds
    under its first name only.

    transformers writes a tied weight once, under its first name (``model.embed_tokens.weight``; Gemma, GPT-2,
    Llama 3.2 1B), while the model's state dict names it twice: the second name is read as the first, where
    this rank holds both (one tensor) or only the copy (a pipeline's last stage: ``pipeline.TiedWeights``,
    whose copies ``LocalStages.tied_copies`` lists). A checkpoint with both names (one this package wrote)
    is read as it is."""
    return {name: first for name, first in _second_names(module).items()
            if name in names and name not in saved and first in saved}


def _second_names(module: nn.Module) -> dict[str, str]:
    """Each tied weight's other names -> its first: held twice on this rank (one tensor), or a pipeline's last
    stage's copy (``LocalStages.tied_copies``)."""
    tied = {other: first for first, names in shared_names(module).items() for other in names[1:]}
    tied.update(getattr(module, "tied_copies", {}))
    return tied


def save_pretrained(pm: PlannedModule, path: str | os.PathLike) -> None:
    """Write ``pm``'s parameters to ``path`` as a Hugging Face safetensors checkpoint (with ``config.json``
    if the model has a transformers config). A collective; ``path`` on a file system every rank sees."""
    root = Path(path)
    model_sd = get_model_state_dict(pm.module)
    _show_experts_whole(pm, model_sd, {})
    for name in _second_names(pm.module):  # a tied weight once, under its first name, as transformers writes it
        model_sd.pop(name, None)
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(root / SHARDED, ignore_errors=True)
    _barrier()
    writer = HuggingFaceStorageWriter(str(root), save_distributed=True, enable_consolidation=True,
                                      fqn_to_index_mapping=dict.fromkeys(_all_names(model_sd), 1))
    dcp.save(model_sd, storage_writer=writer)
    _barrier()  # the coordinator has consolidated
    if _rank() == 0:
        shutil.rmtree(root / SHARDED, ignore_errors=True)
        config = getattr(_unwrapped(pm.module), "config", None)
        if hasattr(config, "save_pretrained"):
            config.save_pretrained(str(root))
    _barrier()


def check_names_and_shapes(model_shapes: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]],
                           path: str | os.PathLike) -> None:
    """Raise ``CheckpointError`` if the model's parameter names and global shapes differ from the
    checkpoint's, naming the first difference (in the model's order) and counting the others."""
    problems = []
    for name, shape in model_shapes.items():
        found = saved.get(name)
        if found is None:
            problems.append(f"the model's '{name}' {_shape(shape)} is not in the checkpoint")
        elif found != shape:
            problems.append(f"'{name}' has shape {_shape(shape)} in the model but {_shape(found)} in the checkpoint")
    problems += [f"the checkpoint's '{name}' {_shape(shape)} is not in the model"
                 for name, shape in saved.items() if name not in model_shapes]
    if problems:
        more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:SHOWN])}{'; ...' if len(problems) > SHOWN else ''})" \
            if len(problems) > 1 else ""
        raise CheckpointError(f"the pretrained checkpoint {path} does not match the model: {problems[0]}{more}; "
                              "load a checkpoint of this architecture and size (the plan's model config)")


def _all_names(model_sd: dict[str, Any]) -> list[str]:
    """Every rank's state-dict names (pipeline ranks hold other stages): one file index for each."""
    return list(_global_shapes(model_sd))


def _unwrapped(module: Any) -> Any:
    """The user's model under DDP's ``module`` wrapper (FSDP2 and TP shard in place)."""
    return module.module if hasattr(module, "module") and hasattr(module, "no_sync") else module


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
