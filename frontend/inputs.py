"""The example inputs torch.export traces a model on, and which of their sizes are batch and sequence.

Three kinds of model input:

    token ids (default)   one (b, s) int64 tensor, passed positionally
    Hugging Face          ``input_ids=`` (b, s) and ``use_cache=False`` as keywords (no KV cache in
                          the output; in the config while tracing where the forward does not name it);
                          found by ``transformers.PreTrainedModel`` when transformers is
                          already imported, else by duck typing (a ``.config`` with ``model_type`` and a
                          forward that takes ``use_cache``)
    example_inputs        a tuple of tensors, or a callable (batch, seq) -> tuple, for models whose
                          input is not token ids (a float (b, features) or (b, s, h) tensor, ...)

Dim 0 of every input tensor is the batch, dynamic; dim 1 is the sequence, dynamic, when the model is a
sequence model: the first input is integer (b, s, ...) token ids or a float tensor of 3 or more dims,
unless ``sequence=`` says otherwise. Example sizes are at least 2 and batch != sequence, because
torch specializes sizes 0 and 1 and gives equal sizes one symbol.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from ..ir import UnsupportedModelError

ExampleInputs = tuple[torch.Tensor, ...] | Callable[[int, int], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Inputs:
    """What ``torch.export.export`` is called with, on the meta device."""

    args: tuple[torch.Tensor, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    dynamic: Any = None  # export's dynamic_shapes, matching args (a tuple) or kwargs (a dict)
    sequence: bool = True  # dim 1 of the first tensor is the sequence
    config: tuple[tuple[str, Any], ...] = ()  # model.config attributes set while the model is traced
    kind: str = "tokens"  # "tokens", "huggingface" or "example_inputs", for messages


def example_sizes(batch: int, seq_len: int, max_seq_len: int | None) -> tuple[int, int]:
    """Example sizes for export: at least 2 (torch specializes sizes 0 and 1), and batch != seq so
    that the two never share a symbol; within the model's max_seq_len when it has one."""
    seq = max(2, min(seq_len, max_seq_len) if max_seq_len else seq_len)
    b = max(2, batch)
    return (b + 1 if b == seq else b), seq


def is_huggingface(model: nn.Module) -> bool:
    """A transformers model, without importing transformers (module docstring)."""
    tf = sys.modules.get("transformers")
    base = getattr(tf, "PreTrainedModel", None) if tf is not None else None
    if isinstance(base, type) and isinstance(model, base):
        return True
    if not isinstance(getattr(getattr(model, "config", None), "model_type", None), str):
        return False
    try:
        return "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _max_seq_len(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    for name in ("max_seq_len", "max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _dynamic(tensor: torch.Tensor, sequence: bool) -> dict[int, Any]:
    return {d: Dim.AUTO for d in range(min(tensor.dim(), 2 if sequence else 1))}


def _is_sequence(first: torch.Tensor) -> bool:
    if first.dtype in (torch.int64, torch.int32) or not first.is_floating_point():
        return first.dim() >= 2
    return first.dim() >= 3


def _resized(tensor: torch.Tensor, b: int, s: int | None) -> torch.Tensor:
    """The tensor as an empty meta tensor with dim 0 = b (and dim 1 = s for a sequence input)."""
    shape = list(tensor.shape)
    shape[0] = b
    if s is not None and len(shape) > 1:
        shape[1] = s
    return torch.zeros(shape, dtype=tensor.dtype, device="meta")


def _from_examples(model: nn.Module, examples: ExampleInputs, batch: int, seq_len: int,
                   sequence: bool | None) -> Inputs:
    what = "example_inputs"
    if callable(examples) and not isinstance(examples, torch.Tensor):
        examples = examples(*example_sizes(batch, seq_len, _max_seq_len(model)))
        what = "example_inputs(batch, seq)"
    if isinstance(examples, torch.Tensor):
        examples = (examples,)
    if not isinstance(examples, (tuple, list)) or not examples or \
            not all(isinstance(t, torch.Tensor) for t in examples):
        raise UnsupportedModelError(f"trace: {what} must be a non-empty tuple of tensors, got "
                                    f"{type(examples).__name__}; pass e.g. example_inputs=(torch.randn(8, 512),)")
    empty = [i for i, t in enumerate(examples) if t.dim() == 0]
    if empty:
        raise UnsupportedModelError(f"trace: {what}[{empty[0]}] is a scalar; every input needs a batch dim 0")
    first = examples[0]
    seq = _is_sequence(first) if sequence is None else sequence
    if seq and first.dim() < 2:
        raise UnsupportedModelError(f"trace: sequence=True but {what}[0] has shape {tuple(first.shape)}, "
                                    "no dim 1 to be the sequence; pass sequence=False")
    b, s = _distinct(int(first.shape[0]), int(first.shape[1]) if seq else None)
    along = [seq and t.dim() > 1 and t.shape[1] == first.shape[1] for t in examples]  # has the sequence dim
    tensors = tuple(_resized(t, b, s if on else None) for t, on in zip(examples, along))
    return Inputs(args=tensors, dynamic=tuple(_dynamic(t, on) for t, on in zip(tensors, along)), sequence=seq,
                  kind="example_inputs")


def _distinct(b: int, s: int | None) -> tuple[int, int | None]:
    """Batch and sequence sizes export keeps as two symbols (module docstring)."""
    s = None if s is None else max(2, s)
    b = max(2, b)
    return (b + 1 if b == s else b), s


def make_inputs(model: nn.Module, *, batch: int, seq_len: int, example_inputs: ExampleInputs | None = None,
                sequence: bool | None = None) -> Inputs:
    """The export inputs for ``model`` (module docstring)."""
    if example_inputs is not None:
        return _from_examples(model, example_inputs, batch, seq_len, sequence)
    b, s = example_sizes(batch, seq_len, _max_seq_len(model))
    tokens = torch.zeros(b, s, dtype=torch.long, device="meta")
    if is_huggingface(model):
        if _names(model, "use_cache"):
            return Inputs(kwargs={"input_ids": tokens, "use_cache": False},
                          dynamic={"input_ids": {0: Dim.AUTO, 1: Dim.AUTO}, "use_cache": None}, kind="huggingface")
        # a forward that does not name use_cache (GraniteMoE's passes it on through **kwargs, which export cannot
        # key a non-tensor under) reads it from the config: off there while the model is traced
        return Inputs(kwargs={"input_ids": tokens}, dynamic={"input_ids": {0: Dim.AUTO, 1: Dim.AUTO}},
                      config=(("use_cache", False),), kind="huggingface")
    return Inputs(args=(tokens,), dynamic=({0: Dim.AUTO, 1: Dim.AUTO},))


def _names(model: nn.Module, name: str) -> bool:
    """Whether the model's forward takes ``name`` as a parameter of its own."""
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return True
