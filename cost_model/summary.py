"""What the cost model reads from a graph, computed once per graph and cached.

The estimate needs only ``graph.dims`` and the parameter total (``graph.params``); the nodes are
not read. Parameters are split the way the parallelisms split them:

* per layer: ``tp_params`` (matmul weights and their biases, sharded by tp), ``norm_params``
  (replicated over tp) and ``expert_params`` (sharded by ep and tp);
* outside the layers: the output projection ``V*h`` on the last pipeline stage, and everything
  else (token and position embeddings, final norm) on the first. When the graph's total is smaller
  than the layers plus a separate output matrix, the embedding is taken as tied to the output
  (``tied_params``): under pipeline parallelism the last stage holds a copy of it, as Megatron-LM's
  and meshplan's runtimes do (``runtime.pipeline.TiedWeights``).

The cache is keyed by ``id(graph)`` and checked against a weak reference, so a graph that dies
frees its entry and a new graph at the same address is not confused with it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace

from ..ir.graph import Graph, ModelDims, OpKind, evaluate
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
    tied_params: int = 0  # the output table a tied head shares with the embedding: the last stage's copy under pp

    @property
    def layer_params(self) -> int:
        return self.tp_params + self.norm_params + self.expert_params


# what the family formula counts in a block: weight matmuls (experts included) and the attention core
COUNTED = (OpKind.MATMUL, OpKind.ATTENTION, OpKind.MOE)
SCALE_TOLERANCE = 0.02  # the formula "holds" within this (GPT-2's matmul biases are 0.5% of a small block)


def flops_scales(graph: Graph, dims: ModelDims) -> tuple[float, float]:
    """(matmul_scale, core_scale): the traced blocks' mean forward FLOPs per token (b s terms: the weight
    matmuls) and per token pair (b s^2 terms: the attention core), each over what the family formula
    (``flops.layer_forward_flops``) counts; 1 where they agree within ``SCALE_TOLERANCE``, or the graph has
    no blocks to count. A node's FLOPs are a polynomial in b and s (``ir.evaluate``): at b = 1 two
    sequence lengths separate the two terms."""
    if not graph.blocks or not dims.layers or not dims.heads:
        return 1.0, 1.0
    s1, s2 = 1024, 2048

    def counted(seq: int) -> float:
        return sum(evaluate(n.flops, batch=1, seq=seq) for b in graph.blocks for n in graph.nodes_of(b)
                   if n.op in COUNTED) / len(graph.blocks)

    f1, f2 = counted(s1), counted(s2)
    core = (f2 - 2 * f1) / (s2 * s2 - 2 * s1 * s1)  # F(s) = a s + c s^2
    linear = (f1 - core * s1 * s1) / s1
    plain = replace(dims, matmul_scale=1.0, core_scale=1.0)
    formula_linear = 2.0 * flops.layer_matmul_params(plain)
    formula_core = flops.attention_core_flops(plain, 1, 1)

    def ratio(graph_count: float, formula_count: float) -> float:
        if formula_count <= 0 or graph_count <= 0:
            return 1.0
        r = graph_count / formula_count
        return 1.0 if abs(r - 1.0) <= SCALE_TOLERANCE else r
    return ratio(linear, formula_linear), ratio(core, formula_core)


def summarize(graph: Graph) -> ModelSummary:
    matmul_scale, core_scale = flops_scales(graph, graph.dims)
    dims = replace(graph.dims, matmul_scale=matmul_scale, core_scale=core_scale)
    tp_params = flops.attention_params(dims) + flops.dense_mlp_params(dims)
    norm = flops.norm_params(dims)
    experts = flops.expert_params(dims)
    in_layers = dims.layers * (tp_params + norm + experts)
    output = dims.vocab * dims.hidden
    total = graph.param_count if graph.params else in_layers + 2 * output + dims.hidden
    outside = max(total - in_layers, 0)
    head = output if outside >= 2 * output else 0
    tied = output if not head and outside >= output else 0
    return ModelSummary(dims=dims, total_params=total, tp_params=tp_params, norm_params=norm,
                        expert_params=experts, embed_params=outside - head, head_params=head, tied_params=tied)


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
