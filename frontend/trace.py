"""``trace``: an ``nn.Module`` taking (batch, seq) token ids to logits -> an ``ir.Graph``.

The order: find the repeated layers; when they are all alike, export a copy with two of them and
replicate the second (``fastpath``), else export the whole model; lower the aten graph to IR nodes
(``lower``); group the nodes into blocks with kinds (``blocks``); list every parameter of the
user's model; take the dimensions from the model's config or the graph (``dims``). The model is
never run on real data and never changed: export runs on a meta copy.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from torch import nn

from ..ir import Graph, ModelDims, Node, Param, UnsupportedModelError
from .blocks import build_blocks, layer_paths, repeated_lists
from .dims import dims_from_config, infer_dims
from .export import example_sizes, export_meta
from .fastpath import fast_path_list, replicate, truncated
from .leaves import LEAF_RULES, LeafCost, LeafRule
from .lower import lower
from .symbolic import dtype_name


def graph_params(model: nn.Module) -> tuple[Param, ...]:
    """Every parameter of the model once (tied weights under their first name)."""
    return tuple(Param(name=name, shape=tuple(p.shape), dtype=dtype_name(p.dtype))
                 for name, p in model.named_parameters())


def _layer_classes(lists: Sequence[tuple[str, nn.ModuleList]]) -> tuple[type, ...]:
    return tuple(type(layer) for _, layers in lists for layer in layers)


def _trace_nodes(model: nn.Module, lists: Sequence[tuple[str, nn.ModuleList]], sizes: tuple[int, int],
                 rules: Mapping[str, LeafRule]) -> tuple[tuple[Node, ...], Mapping[str, LeafCost]]:
    exported = export_meta(model, batch=sizes[0], seq=sizes[1], rules=rules)
    lowered = lower(exported, frozenset(layer_paths(lists)))
    return lowered.nodes, lowered.leaf_costs


def _fast_nodes(model: nn.Module, lists: Sequence[tuple[str, nn.ModuleList]], sizes: tuple[int, int],
                rules: Mapping[str, LeafRule]) -> tuple[tuple[Node, ...], Mapping[str, LeafCost]] | None:
    """Nodes of the whole model from a two-layer trace, or None when the fast path does not apply."""
    list_path = fast_path_list(lists)
    if list_path is None:
        return None
    short = truncated(model, list_path, keep=2)
    nodes, costs = _trace_nodes(short, repeated_lists(short), sizes, rules)
    full = replicate(nodes, list_path, len(lists[0][1]), _layer_classes(lists))
    return None if full is None else (full, costs)


def _graph_dtype(params: Sequence[Param]) -> str:
    counts = Counter(p.dtype for p in params)
    return counts.most_common(1)[0][0] if counts else "float32"


def _dims(model: nn.Module, nodes: Sequence[Node], params: Sequence[Param], blocks: Sequence,
          leaf_costs: Mapping[str, LeafCost]) -> ModelDims:
    config = getattr(model, "config", None)
    if config is not None:
        return dims_from_config(config)
    return infer_dims(nodes, params, blocks, leaf_costs)


def trace(model: nn.Module, *, batch: int = 1, seq_len: int = 128, fast: bool = True,
          leaf_rules: Mapping[str, LeafRule] | None = None) -> Graph:
    """The model's forward pass as an ``ir.Graph`` whose shapes, FLOPs and bytes are expressions in
    ``ir.BATCH`` and ``ir.SEQ``.

    ``batch`` and ``seq_len`` are the example sizes export traces at (the result holds for all sizes);
    ``fast=False`` traces every layer even when they are alike; ``leaf_rules`` adds to (or overrides)
    ``LEAF_RULES``, keyed by a module class's ``module.qualname``.
    """
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(f"trace takes an nn.Module, got {type(model).__name__}")
    rules = {**LEAF_RULES, **(leaf_rules or {})}
    lists = repeated_lists(model)
    sizes = example_sizes(batch, seq_len, getattr(getattr(model, "config", None), "max_seq_len", None))
    traced = _fast_nodes(model, lists, sizes, rules) if fast else None
    nodes, leaf_costs = traced or _trace_nodes(model, lists, sizes, rules)
    params = graph_params(model)
    _check_params(nodes, params)
    blocks = build_blocks(nodes, params, layer_paths(lists), _layer_classes(lists))
    dims = _dims(model, nodes, params, blocks, leaf_costs)
    return Graph(nodes=nodes, params=params, blocks=blocks, dims=dims, dtype=_graph_dtype(params))


def _check_params(nodes: Sequence[Node], params: Sequence[Param]) -> None:
    """Every parameter a node names must be one of the graph's (a fast-path renaming gone wrong would not)."""
    known = {p.name for p in params}
    unknown = sorted({p for n in nodes for p in n.params if p not in known})
    if unknown:
        raise UnsupportedModelError(f"traced nodes read parameters the model does not list: {unknown[:5]}; "
                                    "trace with fast=False, and report this model to meshplan")
