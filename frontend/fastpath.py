"""The fast path: trace two layers of a deep model and copy the second for the rest.

Tracing cost grows with depth (about 7 s for an 80-layer Llama on meta, DESIGN.md), while a
model's repeated layers are usually one layer many times. When every child of the model's one
ModuleList or ModuleDict (anywhere in the tree: ``model.layers``, ``transformer.h``) has the same
structure (``layer_structure``: classes, parameter and buffer shapes, plain attributes such as
``head_dim``, no hooks; an int attribute equal to the layer's own index, as Hugging Face's
``layer_idx`` for the KV cache, counts as the same), the frontend traces a shallow copy that keeps
only the first two layers. Layer 1 is the one copied: it reads the output of a layer, as layers
2..L-1 do. Its nodes are renamed for each layer k (``layers.1`` -> ``layers.k``, and the inputs it
reads from ``layers.0`` -> ``layers.{k-1}``; a ModuleDict's own keys take the place of the
indices), and the nodes after the layers read the last layer.
The copy is taken only when layers 0 and 1 traced to the same kind of block and each traced as one
contiguous run of nodes; otherwise the caller traces the whole model.
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


def fast_path_list(lists: Sequence[tuple[str, Container]]) -> str | None:
    """The path of the one ModuleList or ModuleDict whose >= 3 children are all alike, or None."""
    if len(lists) != 1:
        return None
    path, container = lists[0]
    layers = [layer for _, layer in layers_of(container)]
    if not path or len(layers) < 3:
        return None
    index_keys = _index_keys(layers)
    first = layer_structure(layers[0], index_keys)
    if first is None or any(layer_structure(layer, index_keys) != first for layer in layers[1:]):
        return None
    return path


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


def replicate(nodes: Sequence[Node], layers: Sequence[str], classes: Sequence[type]) -> tuple[Node, ...] | None:
    """The nodes of a two-layer trace (``layers[0]``, ``layers[1]``) extended to every path of ``layers``,
    or None when the two traced layers differ or are not contiguous (module docstring)."""
    first, second = layers[0], layers[1]
    scopes = frozenset((first, second))
    span0, span1 = _span(nodes, first, scopes), _span(nodes, second, scopes)
    if span0 is None or span1 is None or span0.stop != span1.start:
        return None
    grouped = group_by_layer(nodes, (first, second))
    signatures = [block_signature(layer, cls, grouped[layer], ()) for layer, cls in zip((first, second), classes)]
    if signatures[0] != signatures[1]:
        return None
    out = list(nodes[:span1.stop])
    for k in range(2, len(layers)):
        reads = (first, layers[k - 1])
        out += [_rebase_node(n, second, layers[k], reads) for n in nodes[span1.start:span1.stop]]
    last = layers[-1]
    out += [dataclasses.replace(n, inputs=tuple(rebase(i, second, last) or i for i in n.inputs))
            for n in nodes[span1.stop:]]
    return tuple(out)
