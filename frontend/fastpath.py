"""The fast path: trace a few layers of a deep model and copy them for the rest.

Tracing cost grows with depth (about 7 s for an 80-layer Llama on meta, DESIGN.md), while a
model's repeated layers are usually one layer many times, or a short pattern many times after a
few leading layers: GPT-OSS alternates sliding-window and full attention (``config.layer_types``),
Gemma runs five local layers to a global one, DeepSeek-V3 has three dense layers before 58 MoE ones.
The children of the model's one ModuleList or ModuleDict (anywhere in the tree: ``model.layers``,
``transformer.h``) are compared by structure (``layer_structure``: classes, parameter and buffer
shapes, plain attributes such as ``head_dim`` or ``sliding_window``, no hooks; an int attribute equal to
the layer's own index, as Hugging Face's ``layer_idx`` for the KV cache, counts as the same).
``layer_pattern`` finds the fewest ``prefix`` layers and the shortest ``period`` after them such that
layer i >= prefix is like layer prefix + (i - prefix) % period (a uniform stack: prefix 0, period 1),
and the frontend traces a shallow copy that keeps only the first prefix + 2 * period layers. The second
period is the one copied: each of its layers reads the output of a layer like itself, as the later
layers do. Layer k takes the nodes of traced layer t = prefix + period + (k - prefix) % period, renamed
(``layers.t`` -> ``layers.k``, and the inputs it reads from ``layers.{t-1}`` -> ``layers.{k-1}``; a
ModuleDict's own keys take the place of the indices), and the nodes after the layers read the last layer.
The copy is taken only when each layer of the second period traced to the same kind of block as its
twin in the first and every traced layer is one contiguous run of nodes, in order; otherwise the
caller traces the whole model.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from ..ir import Node
from .blocks import Container, block_signature, group_by_layer, layers_of, rebase
from .lower import scope_of

_PLAIN = (int, float, bool, str, type(None))
_INDEX = "<the layer's index>"


def _plain_attributes(module: nn.Module, index_keys: frozenset[str]) -> tuple:
    """Attributes that may steer a forward (``head_dim``, ``top_k``, a patched ``forward``)."""
    out = []
    for key, value in sorted(vars(module).items()):
        if key.startswith("_") or key == "training":
            continue
        if key in index_keys:
            out.append((key, _INDEX))
        elif isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)):
            out.append((key, value))
        elif callable(value) and not isinstance(value, (nn.Module, torch.Tensor)):
            out.append((key, id(value)))
    return tuple(out)


def _hooked(module: nn.Module) -> bool:
    return any(getattr(module, name, None) for name in (
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))


def _index_keys(layers: Sequence[nn.Module]) -> frozenset[tuple[str, str]]:
    """(submodule, attribute) pairs that hold each layer's own index in every layer."""
    def keys(layer: nn.Module, index: int) -> set[tuple[str, str]]:
        return {(name, key) for name, module in layer.named_modules() for key, value in vars(module).items()
                if type(value) is int and value == index}
    found = [keys(layer, i) for i, layer in enumerate(layers)]
    return frozenset(set.intersection(*found)) if found else frozenset()


def layer_structure(layer: nn.Module, index_keys: frozenset[tuple[str, str]] = frozenset()) -> tuple | None:
    """A value equal for two layers that trace alike; None when a hook makes that unknowable.
    ``index_keys``: the attributes that hold the layer's own index (module docstring)."""
    parts = []
    for name, module in layer.named_modules():
        if _hooked(module):
            return None
        params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in module.named_parameters(recurse=False))
        buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers(recurse=False))
        own = frozenset(key for where, key in index_keys if where == name)
        parts.append((name, type(module), params, buffers, _plain_attributes(module, own)))
    return tuple(parts)


def layer_pattern(kinds: Sequence[int]) -> tuple[int, int] | None:
    """(prefix, period) with the fewest layers to trace, prefix + 2 * period, such that ``kinds[i]`` equals
    ``kinds[prefix + (i - prefix) % period]`` for every i >= prefix; None when that trace would not be
    shorter than the whole stack."""
    n = len(kinds)
    for traced in range(2, n):
        for period in range(1, traced // 2 + 1):
            prefix = traced - 2 * period
            if all(kinds[i] == kinds[prefix + (i - prefix) % period] for i in range(prefix, n)):
                return prefix, period
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class FastPath:
    list_path: str  # the ModuleList or ModuleDict whose layers are copied
    prefix: int  # leading layers traced once
    period: int  # layers of the repeated pattern

    @property
    def traced(self) -> int:
        return self.prefix + 2 * self.period


def fast_path_list(lists: Sequence[tuple[str, Container]]) -> FastPath | None:
    """The one ModuleList or ModuleDict whose >= 3 children follow a pattern (``layer_pattern``) that
    tracing fewer of them can copy, or None."""
    if len(lists) != 1:
        return None
    path, container = lists[0]
    layers = [layer for _, layer in layers_of(container)]
    if not path or len(layers) < 3:
        return None
    index_keys = _index_keys(layers)
    structures = [layer_structure(layer, index_keys) for layer in layers]
    if any(st is None for st in structures):
        return None
    ids: dict[tuple, int] = {}
    pattern = layer_pattern([ids.setdefault(st, len(ids)) for st in structures])
    return None if pattern is None else FastPath(path, *pattern)


def _shallow(module: nn.Module) -> nn.Module:
    twin = copy.copy(module)
    twin._modules = dict(module._modules)  # its own children dict: the user's module is never changed
    return twin


def truncated(model: nn.Module, list_path: str, keep: int) -> nn.Module:
    """A shallow copy of ``model`` whose ModuleList (or ModuleDict) at ``list_path`` keeps its first
    ``keep`` layers."""
    *parents, last = list_path.split(".")
    root = parent = _shallow(model)
    for part in parents:
        child = _shallow(parent._modules[part])
        parent._modules[part] = child
        parent = child
    container = parent._modules[last]
    kept = layers_of(container)[:keep]
    parent._modules[last] = (nn.ModuleDict(kept) if isinstance(container, nn.ModuleDict)
                             else nn.ModuleList(layer for _, layer in kept))
    return root


def _rebase_node(node: Node, old: str, new: str, reads_from: tuple[str, str] | None) -> Node:
    """``node`` of layer ``old`` as a node of layer ``new``; inputs under reads_from[0] move to
    reads_from[1] (the previous layer)."""
    def moved(name: str) -> str:
        here = rebase(name, old, new)
        if here is not None:
            return here
        there = rebase(name, *reads_from) if reads_from else None
        return name if there is None else there
    return dataclasses.replace(node, name=moved(node.name), module_path=rebase(node.module_path, old, new) or "",
                               params=tuple(moved(p) for p in node.params), inputs=tuple(moved(i) for i in node.inputs))


def _span(nodes: Sequence[Node], layer: str, scopes: frozenset[str]) -> range | None:
    at = [i for i, n in enumerate(nodes) if scope_of(n.module_path, scopes) == layer]
    return range(at[0], at[-1] + 1) if at and at == list(range(at[0], at[-1] + 1)) else None


def replicate(nodes: Sequence[Node], layers: Sequence[str], classes: Sequence[type], prefix: int = 0,
              period: int = 1) -> tuple[Node, ...] | None:
    """The nodes of a trace of ``layers[:prefix + 2 * period]`` extended to every path of ``layers``, or None
    when a layer of the second period differs from its twin in the first or the traced layers are not
    contiguous and in order (module docstring)."""
    traced = prefix + 2 * period
    scopes = frozenset(layers[:traced])
    spans = [_span(nodes, layer, scopes) for layer in layers[:traced]]
    if any(sp is None for sp in spans) or any(a.stop != b.start for a, b in zip(spans, spans[1:])):
        return None
    grouped = group_by_layer(nodes, layers[:traced])
    signatures = [block_signature(layer, cls, grouped[layer], ()) for layer, cls in zip(layers[:traced], classes)]
    if signatures[prefix:prefix + period] != signatures[prefix + period:traced]:
        return None
    end = spans[-1].stop
    out = list(nodes[:end])
    for k in range(traced, len(layers)):
        t = prefix + period + (k - prefix) % period
        reads = (layers[t - 1], layers[k - 1])
        out += [_rebase_node(n, layers[t], layers[k], reads) for n in nodes[spans[t].start:spans[t].stop]]
    before, last = layers[traced - 1], layers[-1]
    out += [dataclasses.replace(n, inputs=tuple(rebase(i, before, last) or i for i in n.inputs))
            for n in nodes[end:]]
    return tuple(out)
