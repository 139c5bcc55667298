"""``trace``: an ``nn.Module`` -> an ``ir.Graph`` with its ``ModelStructure``.

The model takes (batch, seq) token ids, Hugging Face keywords, or the user's example inputs
(``inputs``). The order: find the repeated layers; when they follow a pattern (all alike, or a short
period after a few leading layers), export a copy with the leading layers and two periods and
replicate the second (``fastpath``), else export the whole model; lower the aten graph
to IR nodes (``lower``); group the nodes into blocks with kinds (``blocks``); list every parameter
of the user's model; find the role of each module by dataflow (``structure``); take the dimensions
from the model's config or the graph (``dims``). The model is never run on real data and never
changed: export runs on a meta copy.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

from torch import nn

from ..ir import Graph, ModelDims, ModelStructure, Node, Param, UnsupportedModelError
from .blocks import Container, build_blocks, layer_paths, layers_of, repeated_lists
from .calls import returns_tuple
from .dims import dims_from_config, has_config_dims, infer_dims, normalized_family
from .export import export_meta
from .fastpath import fast_path_list, replicate, truncated
from .head_split import heads_split_cleanly
from .inputs import ExampleInputs, Inputs, make_inputs
from .leaves import LEAF_RULES, LeafCost, LeafRule
from .lower import lower
from .structure import find_structure
from .symbolic import dtype_name


def graph_params(model: nn.Module) -> tuple[Param, ...]:
    """Every parameter of the model once (tied weights under their first name)."""
    return tuple(Param(name=name, shape=tuple(p.shape), dtype=dtype_name(p.dtype))
                 for name, p in model.named_parameters())


def _layer_classes(lists: Sequence[tuple[str, Container]]) -> tuple[type, ...]:
    return tuple(type(layer) for _, layers in lists for _, layer in layers_of(layers))


def _trace_nodes(model: nn.Module, lists: Sequence[tuple[str, Container]], inputs: Inputs,
                 rules: Mapping[str, LeafRule], calls: dict[str, str] | None = None
                 ) -> tuple[tuple[Node, ...], Mapping[str, LeafCost]]:
    paths = layer_paths(lists)
    exported = export_meta(model, inputs=inputs, rules=rules, probe=paths[0] if paths else "", calls=calls)
    lowered = lower(exported, frozenset(layer_paths(lists)))
    return lowered.nodes, lowered.leaf_costs


def _fast_nodes(model: nn.Module, lists: Sequence[tuple[str, Container]], inputs: Inputs,
                rules: Mapping[str, LeafRule], calls: dict[str, str] | None = None
                ) -> tuple[tuple[Node, ...], Mapping[str, LeafCost]] | None:
    """Nodes of the whole model from a trace of a few of its layers (``fastpath``), or None when the fast
    path does not apply."""
    fast = fast_path_list(lists)
    if fast is None:
        return None
    short = truncated(model, fast.list_path, keep=fast.traced)
    nodes, costs = _trace_nodes(short, repeated_lists(short), inputs, rules, calls)
    full = replicate(nodes, layer_paths(lists), _layer_classes(lists), fast.prefix, fast.period)
    return None if full is None else (full, costs)


def _graph_dtype(params: Sequence[Param]) -> str:
    counts = Counter(p.dtype for p in params)
    return counts.most_common(1)[0][0] if counts else "float32"


def _dims(model: nn.Module, nodes: Sequence[Node], params: Sequence[Param], blocks: Sequence,
          leaf_costs: Mapping[str, LeafCost], structure: ModelStructure) -> ModelDims:
    config = getattr(model, "config", None)
    if config is not None and has_config_dims(config):
        dims = dims_from_config(config)
        routed = [c for c in leaf_costs.values() if c.experts]
        if dims.experts and not dims.top_k and routed:  # a config naming its experts but not how many a token takes
            dims = dataclasses.replace(dims, top_k=routed[0].top_k)
    else:  # no config, or one without the usual names (e.g. T5's num_heads): read the graph
        dims = infer_dims(nodes, params, blocks, leaf_costs)
    return dataclasses.replace(normalized_family(dims, structure), expert_bias=_experts_have_bias(params, structure))


def _experts_have_bias(params: Sequence[Param], structure: ModelStructure) -> bool:
    """Whether a parameter of the experts (``structure.experts``, a path inside each block) is a bias."""
    inside = f".{structure.experts}."
    return bool(structure.experts) and any(inside in f".{p.name}" and "bias" in p.name.rsplit(".", 1)[-1]
                                           for p in params)


def trace(model: nn.Module, *, batch: int = 1, seq_len: int = 128, example_inputs: ExampleInputs | None = None,
          sequence: bool | None = None, fast: bool = True, leaf_rules: Mapping[str, LeafRule] | None = None) -> Graph:
    """The model's forward pass as an ``ir.Graph`` whose shapes, FLOPs and bytes are expressions in
    ``ir.BATCH`` and ``ir.SEQ``, with ``graph.structure`` the role of each module (``find_structure``).

    ``batch`` and ``seq_len`` are the example sizes export traces at (the result holds for all sizes);
    ``example_inputs`` (a tuple of tensors, or a callable (batch, seq) -> tuple) replaces the default
    (batch, seq) token ids: dim 0 of each is the batch, dim 1 the sequence when ``sequence`` (by
    default: the first input is integer (b, s) ids or a float tensor of 3 or more dims);
    ``fast=False`` traces every layer even when they are alike; ``leaf_rules`` adds to (or overrides)
    ``LEAF_RULES``, keyed by a module class's ``module.qualname``.
    """
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(f"trace takes an nn.Module, got {type(model).__name__}")
    rules = {**LEAF_RULES, **(leaf_rules or {})}
    lists = repeated_lists(model)
    inputs = make_inputs(model, batch=batch, seq_len=seq_len, example_inputs=example_inputs, sequence=sequence)
    calls: dict[str, str] = {}  # how the first block calls its modules (frontend/calls.py)
    traced = _fast_nodes(model, lists, inputs, rules, calls) if fast else None
    nodes, leaf_costs = traced or _trace_nodes(model, lists, inputs, rules, calls)
    params = graph_params(model)
    _check_params(nodes, params)
    blocks = build_blocks(nodes, params, layer_paths(lists), _layer_classes(lists))
    graph = Graph(nodes=nodes, params=params, blocks=blocks, dims=_placeholder_dims(), dtype=_graph_dtype(params))
    structure = find_structure(model, graph)
    if structure.blocks:  # how the first block was called and what it returned: the module at its own path, ""
        structure = dataclasses.replace(structure, block_tuple=returns_tuple(calls, ""))
    if structure.attn:
        structure = dataclasses.replace(structure, attn_kwarg=calls.get(structure.attn, ""),
                                        attn_tuple=returns_tuple(calls, structure.attn))
    if structure.mlp:
        structure = dataclasses.replace(structure, mlp_tuple=returns_tuple(calls, structure.mlp))
    if example_inputs is None and structure.attn_split and not heads_split_cleanly(_probe_model(model, lists),
                                                                                     structure):
        structure = dataclasses.replace(structure, attn_whole=True, notes=structure.notes + (
            f"{structure.block_path('*')}.{structure.attn}: its forward reshapes q, k and v by the model's whole "
            "head count (given a tensor-parallel rank's heads, it would fold the sequence and compute something "
            "else); tensor parallelism keeps attention replicated",))
    dims = _dims(model, nodes, params, blocks, leaf_costs, structure)
    return dataclasses.replace(graph, dims=dims, structure=structure)


def _probe_model(model: nn.Module, lists: Sequence[tuple[str, Container]]) -> nn.Module:
    """``model`` with its first few layers only where the fast path applies (the head-split probe runs block 0)."""
    fast = fast_path_list(lists)
    return truncated(model, fast.list_path, keep=fast.traced) if fast is not None else model


def _placeholder_dims() -> ModelDims:
    """Dims for the structure search, which reads nodes and parameters only."""
    return ModelDims(family="custom", layers=0, hidden=0, heads=0, kv_heads=0, ffn_hidden=0, vocab=0)


def _check_params(nodes: Sequence[Node], params: Sequence[Param]) -> None:
    """Every parameter a node names must be one of the graph's (a fast-path renaming gone wrong would not)."""
    known = {p.name for p in params}
    unknown = sorted({p for n in nodes for p in n.params if p not in known})
    if unknown:
        raise UnsupportedModelError(f"traced nodes read parameters the model does not list: {unknown[:5]}; "
                                    "trace with fast=False, and report this model to meshplan")
