"""What the cost model reads from a graph, computed once per graph and cached.

The estimate needs only ``graph.dims`` and the parameter total (``graph.params``); the nodes are
not read. Parameters are split the way the parallelisms split them:

* per layer: ``tp_params`` (matmul weights and their biases, sharded by tp), ``norm_params``
  (replicated over tp) and ``expert_params`` (sharded by ep and tp);
* outside the layers: the output projection ``V*h`` on the last pipeline stage, and everything
  else (token and position embeddings, final norm) on the first. When the graph's total is smaller
  than the layers plus a separate output matrix, the embedding is taken as tied to the output.

The cache is keyed by ``id(graph)`` and checked against a weak reference, so a graph that dies
frees its entry and a new graph at the same address is not confused with it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from ..ir.graph import Graph, ModelDims
from . import flops


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSummary:
    dims: ModelDims
    total_params: int
    tp_params: int  # per layer
    norm_params: int  # per layer
    expert_params: int  # per layer
    embed_params: int  # first stage
    head_params: int  # last stage (0 when tied to the embedding)

    @property
    def layer_params(self) -> int:
        return self.tp_params + self.norm_params + self.expert_params


def summarize(graph: Graph) -> ModelSummary:
    dims = graph.dims
    tp_params = flops.attention_params(dims) + flops.dense_mlp_params(dims)
    norm = flops.norm_params(dims)
    experts = flops.expert_params(dims)
    in_layers = dims.layers * (tp_params + norm + experts)
    output = dims.vocab * dims.hidden
    total = graph.param_count if graph.params else in_layers + 2 * output + dims.hidden
    outside = max(total - in_layers, 0)
    head = output if outside >= 2 * output else 0
    return ModelSummary(dims=dims, total_params=total, tp_params=tp_params, norm_params=norm,
                        expert_params=experts, embed_params=outside - head, head_params=head)


_CACHE: dict[int, tuple[weakref.ref, ModelSummary]] = {}


def _forget(key: int) -> None:
    _CACHE.pop(key, None)


def summary_of(graph: Graph) -> ModelSummary:
    """The summary of ``graph``, computed on first use."""
    key = id(graph)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    summary = summarize(graph)
    _CACHE[key] = (weakref.ref(graph, lambda _ref, k=key: _forget(k)), summary)
    return summary
