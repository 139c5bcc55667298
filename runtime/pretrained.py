"""Pretrained weights: a Hugging Face safetensors checkpoint into the sharded model, and back.

``load_pretrained(pm, DIR)`` reads the directory ``save_pretrained`` of transformers writes (one
``model.safetensors`` or several with their ``model.safetensors.index.json``) with DCP's
``HuggingFaceStorageReader``: the model's state dict (DTensor shards under TP/FSDP, this rank's
stages under pipeline parallelism, all experts as one DTensor over ep as ``checkpoint.py`` shows
them) is the load plan, so each rank reads only the slices it holds (safetensors' ``get_slice`` on a
memory map). Names are the model's own parameter names, which for a transformers model are the
checkpoint's. Before any tensor is read, the names and global shapes are compared (every rank gets
the same verdict) and the first difference is named. Where transformers changes a checkpoint at load
(``checkpoint_layout``), the loader does the same: a tensor stored under another name is read under it, and
experts stored one by one (Mixtral's, Qwen3-MoE's, OLMoE's Hub layout) are stacked into the model's tensor of
all experts, each rank reading only the slices of the experts and rows it holds (``Stacked``). An emitted
script, which holds the sharded model but no ``PlannedModule``, calls ``load_pretrained_into(model, DIR)``:
the same code.

``save_pretrained(pm, DIR)`` writes the same format with ``HuggingFaceStorageWriter``: every rank
writes its shards, the coordinator consolidates them into ``model-00001-of-0000N.safetensors`` and
the index (then the shards are removed), and rank 0 writes the model's ``config.json`` if it has a
transformers config: the directory loads with ``from_pretrained``. A tied weight (a head tied to the token
embedding) is written once, under its first name, as transformers writes it, and read into every holder.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

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
    checked_layout(model, shapes, saved, path)


def checked_layout(model: Any, shapes: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]],
                   path: str | os.PathLike) -> Layout:
    """``checkpoint_layout`` of the model's ``shapes`` (global), checked: ``shapes`` is renamed to the checkpoint's
    names, each assembled parameter's shape compared (``check_stacked``) and the rest compared with the checkpoint's
    other tensors (``check_names_and_shapes``); raises ``CheckpointError`` at the first difference."""
    layout = checkpoint_layout(model, shapes, saved, path)
    for name, stored in layout.renamed.items():
        shapes[stored] = shapes.pop(name)
    check_stacked(layout.stacked, shapes, saved, path)
    check_names_and_shapes(shapes, layout.unstacked(saved), path)
    return layout


@dataclass(frozen=True)
class Stacked:
    """A model parameter that transformers assembles at load from several checkpoint tensors (a ``WeightConverter``
    of ``MergeModulelist``, then ``Concatenate`` where gate and up are fused): ``parts[j]`` names, in expert order,
    the tensors stacked on ``stack_dim`` into part j, and the parts are concatenated on ``cat_dim`` (Mixtral's
    ``experts.gate_up_proj`` (E, 2I, H): parts ``experts.{0..E-1}.w1.weight`` and ``...w3.weight``, each (I, H))."""

    parts: tuple[tuple[str, ...], ...]
    stack_dim: int = 0
    cat_dim: int = 0

    def shape(self, saved: dict[str, tuple[int, ...]]) -> tuple[int, ...] | None:
        """The assembled tensor's shape, or None where the parts' shapes do not fit together."""
        stacked = []
        for part in self.parts:
            one = {saved[name] for name in part}
            if len(one) != 1:
                return None
            (dims,) = one
            stacked.append((*dims[:self.stack_dim], len(part), *dims[self.stack_dim:]))
        rest = {dims[:self.cat_dim] + dims[self.cat_dim + 1:] for dims in stacked}
        if len(rest) != 1:
            return None
        first = stacked[0]
        return (*first[:self.cat_dim], sum(dims[self.cat_dim] for dims in stacked), *first[self.cat_dim + 1:])

    def read(self, files: dict[str, Any], offset: tuple[int, ...], size: tuple[int, ...]) -> torch.Tensor:
        """The block ``[offset, offset + size)`` of the assembled tensor, read slice by slice from the safetensors
        ``files`` (name -> an open ``safe_open``): only the experts and rows of that block."""
        def source(index: int) -> int:  # a dim of the assembled tensor in a part's tensors (no stack dim)
            return index - (index > self.stack_dim)

        lo, hi = offset[self.cat_dim], offset[self.cat_dim] + size[self.cat_dim]
        pieces, start = [], 0
        for part in self.parts:
            length = files[part[0]].get_slice(part[0]).get_shape()[source(self.cat_dim)]
            a, b = max(lo, start), min(hi, start + length)
            if a < b:
                window = [slice(o, o + n) for o, n in zip(offset, size)]
                window[self.cat_dim] = slice(a - start, b - start)
                experts = window.pop(self.stack_dim)
                pieces.append(torch.stack([files[name].get_slice(name)[tuple(window)]
                                           for name in part[experts]], dim=self.stack_dim))
            start += length
        return torch.cat(pieces, dim=self.cat_dim)


@dataclass(frozen=True)
class Layout:
    """Where the model's parameters are in a checkpoint other than under their own names: ``renamed`` (model
    name -> checkpoint name) and ``stacked`` (model name -> the tensors assembled into it)."""

    renamed: dict[str, str]
    stacked: dict[str, Stacked]

    def unstacked(self, saved: dict[str, Any]) -> dict[str, Any]:
        """``saved`` without the tensors that ``stacked`` assembles."""
        parts = {name for stacked in self.stacked.values() for part in stacked.parts for name in part}
        return {name: value for name, value in saved.items() if name not in parts}


def checkpoint_layout(model: Any, names: Collection[str], saved: Collection[str], path: str | os.PathLike) -> Layout:
    """How the checkpoint stores the model's ``names`` where transformers changes them at load (its
    ``conversion_mapping``): tensors under another name (GPT-NeoX's ``embed_out`` is the model's ``lm_head``, old
    checkpoints' ``LayerNorm.gamma`` a ``weight``), each rename applied as transformers applies it
    (``WeightRenaming.rename_source_key``, in order), and experts stored one by one that transformers stacks into
    one tensor (the Hub layout of Mixtral, Qwen3-MoE, OLMoE: ``MergeModulelist``, then ``Concatenate`` of gate and
    up), which the loader assembles the same way, each rank reading only its experts' slices (``Stacked``). A
    conversion of any other kind is refused with ``CheckpointError``. Empty for a model that is not a transformers
    model."""
    try:
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import WeightRenaming, get_model_conversion_mapping
    except ImportError:  # transformers is optional: a user's own model names its tensors itself
        return Layout({}, {})
    model = _unwrapped(model)
    stages = getattr(model, "_stages", None)  # pipeline.LocalStages: each stage runs on a copy of the model's root
    if stages:
        model = getattr(stages[0], "_root", model)
    if not isinstance(model, PreTrainedModel):
        return Layout({}, {})
    with _transformers_classes(model, PreTrainedModel):
        transforms = get_model_conversion_mapping(model)
    renames = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    wanted = set(names) - set(saved)
    renamed: dict[str, str] = {}
    experts: dict[str, dict[str, dict[int, str]]] = {}  # target -> source pattern -> expert index -> stored
    found: dict[str, Any] = {}
    for stored in saved:
        name = stored
        for rename in renames:
            name = rename.rename_source_key(name)[0]
        if name != stored and name in wanted:
            renamed[name] = stored
        elif stored not in names and (hit := next((c for c in converters if c.rename_source_key(name)[1]), None)):
            target, pattern = hit.rename_source_key(name)
            index = _expert_index(pattern, name)
            if not _stacks(hit) or index is None or target not in wanted:
                raise CheckpointError(_converted(path, stored, hit))
            experts.setdefault(target, {}).setdefault(pattern, {})[index] = stored
            found[target] = hit
    stacked = {}
    for target, by_pattern in experts.items():
        hit = found[target]
        parts = [by_pattern.get(pattern, {}) for pattern in hit.source_patterns]
        if any(sorted(part) != list(range(len(parts[0]))) for part in parts):
            raise CheckpointError(f"the pretrained checkpoint {path} stores the experts of '{target}' one by one but "
                                  f"not each of 0..E-1 for every part ({[sorted(part) for part in parts]}); give a "
                                  "complete checkpoint")
        ops = hit.operations
        stacked[target] = Stacked(tuple(tuple(part[i] for i in sorted(part)) for part in parts),
                                  stack_dim=ops[0].dim, cat_dim=ops[1].dim if len(ops) > 1 else 0)
    return Layout(renamed, stacked)


@contextlib.contextmanager
def _transformers_classes(model: nn.Module, base: type) -> Iterator[None]:
    """Each transformers model among ``model``'s modules (subclasses of ``base``) under its own class for the time of
    the block: fully_shard gave each module it shards a class ``FSDP<Name>`` defined outside transformers, which
    transformers takes for custom code and skips when it collects the conversion mappings (by class name and
    ``model_type``)."""
    swapped = []
    for module in model.modules():
        if isinstance(module, FSDPModule) and isinstance(module, base):
            original = next(c for c in type(module).__mro__ if issubclass(c, base) and not issubclass(c, FSDPModule))
            swapped.append((module, type(module)))
            module.__class__ = original
    try:
        yield
    finally:
        for module, cls in swapped:
            module.__class__ = cls


def _stacks(converter: Any) -> bool:
    """The converter stacks experts (``MergeModulelist``), then concatenates the parts (``Concatenate``) where it
    has several, on another dim: what ``Stacked`` assembles."""
    from transformers.core_model_loading import Concatenate, MergeModulelist

    ops = list(getattr(converter, "operations", ()))
    if not ops or type(ops[0]) is not MergeModulelist or getattr(converter, "quantization_operation", None):
        return False
    if len(ops) == 1:
        return len(converter.source_patterns) == 1
    return len(ops) == 2 and type(ops[1]) is Concatenate and ops[1].dim != ops[0].dim


def _expert_index(pattern: str, name: str) -> int | None:
    """The number a source pattern's ``*`` matches in ``name`` (``.experts.*.w1.weight``: the expert)."""
    if pattern.count("*") != 1:
        return None
    found = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), name)
    return int(found.group(1)) if found else None


def _converted(path: str | os.PathLike, stored: str, hit: Any) -> str:
    return (f"the pretrained checkpoint {path} stores {stored!r} in a layout transformers converts at load "
            f"({type(hit).__name__} {list(hit.source_patterns)} -> {list(hit.target_patterns)} by "
            f"{[type(op).__name__ for op in getattr(hit, 'operations', ())]}), a conversion meshplan does not make (it "
            "stacks experts stored one by one, and reads every other tensor into one parameter); start from a "
            "checkpoint in the model's own layout (this package's save_pretrained writes one), or train from scratch")


def check_stacked(stacked: dict[str, Stacked], shapes: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]],
                  path: str | os.PathLike) -> None:
    """Each assembled parameter has the model's shape (``CheckpointError`` naming it if not); then taken out of
    ``shapes`` (its parts are taken out of the checkpoint's by ``Layout.unstacked``)."""
    for name, assembled in stacked.items():
        got, want = assembled.shape(saved), shapes.pop(name)
        if got != want:
            what = _shape(got) if got is not None else "of parts whose shapes do not fit together"
            raise CheckpointError(f"the pretrained checkpoint {path} does not match the model: '{name}' {_shape(want)} "
                                  f"is assembled from {assembled.parts[0][0]!r} and the rest of its experts "
                                  f"{what}; load a checkpoint of this architecture and size (the plan's model config)")


def _fill_stacked(stacked: dict[str, Stacked], model_sd: dict[str, Any], path: str | os.PathLike) -> None:
    """Copy into each assembled parameter of ``model_sd`` the block of it this rank holds (a DTensor's local
    shard, at its global offset; a plain tensor whole), read from the checkpoint's safetensors files."""
    if not stacked:
        return
    from safetensors import safe_open

    needed = {name for assembled in stacked.values() for part in assembled.parts for name in part}
    with contextlib.ExitStack() as stack:
        files = {}
        for file in find_safetensors(path):
            handle = stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
            files.update({name: handle for name in handle.keys() if name in needed})
        for name, assembled in stacked.items():
            tensor = model_sd[name]
            if isinstance(tensor, DTensor):
                size, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh,
                                                                     tensor.placements)
                local = tensor.to_local()
            else:
                size, offset, local = tuple(tensor.shape), (0,) * tensor.dim(), tensor
            if local.numel():
                with torch.no_grad():
                    local.copy_(assembled.read(files, tuple(offset), tuple(size)))


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
    # every rank's names (a pipeline rank holds its stages only): each rank reaches the same verdict
    layout = checked_layout(module, _global_shapes(load_sd), saved, path)
    for name, stored in layout.renamed.items():  # GPT-NeoX's embed_out
        if name in load_sd:
            load_sd[stored] = load_sd.pop(name)
    for name in layout.stacked:  # experts stored one by one: assembled below, not read by DCP
        load_sd.pop(name, None)
    dcp.load(load_sd, storage_reader=reader)
    _fill_stacked({name: s for name, s in layout.stacked.items() if name in model_sd}, model_sd, path)
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
