"""Repeated layers: find them, group their nodes into ``ir.Block`` values, and name their kinds.

A repeated layer is a child of an ``nn.ModuleList`` (``layers.3``) or an ``nn.ModuleDict``
(torchtitan's ``layers["3"]``, also ``layers.3``) of alike children that is not inside another
repeated layer, so that a list of experts inside a layer stays part of its layer. Two layers
are of the same kind when their signatures are equal: the layer's class, its parameters (names
relative to the layer, shapes, dtypes), and its nodes in order (kind, target, module and
parameters relative to the layer, which inputs come from inside the layer, shapes, FLOPs, bytes).
Kinds are named ``{Class}#{k}`` in order of first appearance, e.g. ``Block#0``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from torch import nn

from ..ir import Block, Node, Param
from .lower import scope_of

OUTSIDE = "<outside>"


Container = nn.ModuleList | nn.ModuleDict


def repeated_lists(model: nn.Module) -> tuple[tuple[str, Container], ...]:
    """(path, container) of every outermost ModuleList or ModuleDict whose children are alike (one class)
    and all hold parameters; nanoGPT's ``transformer`` dict of wte, wpe, h and ln_f is not one, its
    ``transformer.h`` is."""
    found: list[tuple[str, Container]] = []
    for path, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.ModuleDict)) or not len(module):
            continue
        if any(path.startswith(outer + ".") for outer, _ in found):
            continue
        children = [child for _, child in module.named_children()]
        if len({type(c) for c in children}) == 1 and all(any(True for _ in c.parameters()) for c in children):
            found.append((path, module))
    return tuple(found)


def layers_of(container: Container) -> list[tuple[str, nn.Module]]:
    """(key, layer) in order: "0", "1", ... for a ModuleList, the keys of a ModuleDict."""
    return list(container.named_children())


def layer_paths(lists: Iterable[tuple[str, Container]]) -> tuple[str, ...]:
    return tuple(f"{path}.{key}" if path else key for path, layers in lists for key, _ in layers_of(layers))


def rebase(name: str, old: str, new: str) -> str | None:
    """``name`` with the layer prefix ``old`` swapped for ``new``, or None when it is not under ``old``.
    Names under a layer are its path, ``{old}.sub.module`` or ``{old}/op_i``."""
    if name == old or name.startswith((old + ".", old + "/")):
        return new + name[len(old):]
    return None


def _relative(name: str, scope: str) -> str:
    rel = rebase(name, scope, "")
    return OUTSIDE if rel is None else rel


def _node_signature(node: Node, scope: str) -> tuple:
    return (node.op, node.target, _relative(node.module_path, scope),
            tuple(_relative(p, scope) for p in node.params), tuple(_relative(i, scope) for i in node.inputs),
            node.input_metas, node.outputs, node.flops, node.bytes, node.leaf)


def block_signature(scope: str, cls: type, nodes: Sequence[Node], params: Sequence[Param]) -> tuple:
    """What must be equal for two layers to be of one kind (module docstring)."""
    return (cls.__qualname__, tuple((_relative(p.name, scope), p.shape, p.dtype) for p in params),
            tuple(_node_signature(n, scope) for n in nodes))


def group_by_layer(nodes: Sequence[Node], layers: Sequence[str]) -> dict[str, list[Node]]:
    scopes = frozenset(layers)
    grouped: dict[str, list[Node]] = {layer: [] for layer in layers}
    for node in nodes:
        scope = scope_of(node.module_path, scopes)
        if scope:
            grouped[scope].append(node)
    return grouped


def _params_by_layer(params: Sequence[Param], layers: Sequence[str]) -> dict[str, list[Param]]:
    """The parameters under each layer path, in one pass: asking every layer about every parameter took
    layers x parameters steps (10^10 for a 10^5-layer config)."""
    scopes = frozenset(layers)
    owned: dict[str, list[Param]] = {layer: [] for layer in layers}
    for param in params:
        scope = scope_of(param.name, scopes)
        if scope:
            owned[scope].append(param)
    return owned


def build_blocks(nodes: Sequence[Node], params: Sequence[Param], layers: Sequence[str],
                 classes: Sequence[type]) -> tuple[Block, ...]:
    """One Block per layer path (in order), with kinds shared by structurally equal layers."""
    grouped = group_by_layer(nodes, layers)
    owned = _params_by_layer(params, layers)
    kinds: dict[tuple, str] = {}
    blocks = []
    for index, (layer, cls) in enumerate(zip(layers, classes)):
        own = owned[layer]
        signature = block_signature(layer, cls, grouped[layer], own)
        kind = kinds.setdefault(signature, f"{cls.__name__}#{len(kinds)}")
        blocks.append(Block(name=layer, kind=kind, index=index, nodes=tuple(n.name for n in grouped[layer]),
                            params=tuple(p.name for p in own)))
    return tuple(blocks)
