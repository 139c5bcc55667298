"""The fusion pass: find chains of IR ops that one generated kernel can replace, and keep those
that move fewer bytes fused.

The chains are the patterns of ``codegen.kernels.patterns.PATTERNS`` (rules as data): bias + GeLU,
SwiGLU, residual add + RMSNorm / LayerNorm, scale + mask + softmax, (bias +) dropout + add. The
memory-traffic model, in bytes, with shapes in ``ir.BATCH`` and ``ir.SEQ``:

    unfused = sum over the chain's ops of (bytes read + bytes written)       each op goes to memory
              (the node's own ``bytes``; a matmul's bias epilogue: its output read and written
              plus the bias, the pass a separate bias add makes)
    fused   = sum of the chain's external inputs, each once, + its outputs   one pass
    saved   = unfused - fused

A fusion is kept when ``saved`` is positive at every batch and sequence length (every coefficient of
the polynomial in b and s is non-negative). The model is first-order, as the roofline of
``cost_model.kernels`` is: it counts forward traffic and ignores caches. A chain's intermediate
must not be read outside it, unless it is one of the fused op's outputs (an add + norm writes the
sum: it is the next residual). Overlapping matches go to the pattern listed first.
"""
from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from ..ir import BATCH, SEQ, Graph, Node, OpKind, Param, TensorMeta
from .kernels.patterns import COMMUTATIVE, PATTERNS, Broadcast, Kind, Pattern, Step


@dataclass(frozen=True, slots=True, kw_only=True)
class Fusion:
    """A chain of IR nodes one fused kernel replaces."""

    pattern: str  # the Pattern's name, what ir.Plan.fusions records
    nodes: tuple[str, ...]  # IR nodes of the chain, in order (an epilogue step's matmul keeps its GEMM)
    args: tuple[tuple[str, str], ...]  # (the fused op's argument, the IR node or parameter that feeds it)
    outputs: tuple[tuple[str, str], ...]  # (the fused op's output, the IR node whose output it replaces)
    expr: sympy.Expr | None  # the elementwise output as an expression of the args; None for row-wise
    unfused_bytes: sympy.Expr
    fused_bytes: sympy.Expr
    block: str = ""  # the repeated layer that holds the chain, "" outside one

    def __post_init__(self) -> None:
        if not self.nodes or not self.outputs:
            raise ValueError(f"fusion {self.pattern!r} needs at least one node and one output")
        object.__setattr__(self, "unfused_bytes", sympy.sympify(self.unfused_bytes))
        object.__setattr__(self, "fused_bytes", sympy.sympify(self.fused_bytes))

    @property
    def saved_bytes(self) -> sympy.Expr:
        return sympy.expand(self.unfused_bytes - self.fused_bytes)

    def __str__(self) -> str:
        return f"{self.pattern}({', '.join(self.nodes)}): saves {self.saved_bytes} bytes"


@dataclass(frozen=True, slots=True)
class _Source:
    """What feeds an argument: a node's output or a parameter, and its meta."""

    name: str
    meta: TensorMeta


def op_name(node: Node) -> str:
    """``aten.gelu.default`` -> ``gelu``; in-place ops as their copies."""
    parts = node.target.split(".")
    name = parts[1] if parts[0] == "aten" and len(parts) > 1 else node.target
    return name.rstrip("_")


def _param_meta(params: Mapping[str, Param], name: str) -> TensorMeta:
    p = params[name]
    return TensorMeta(shape=p.shape, dtype=p.dtype)


def _bind_epilogue(params: Mapping[str, Param], node: Node, step: Step) -> dict[str, _Source] | None:
    """A matmul with a bias: its output (before the bias) and the bias parameter."""
    biases = [p for p in node.params if p.endswith("bias")]
    if node.op is not OpKind.MATMUL or len(biases) != 1 or not node.outputs:
        return None
    return {step.args[0]: _Source(node.name, node.outputs[0]), step.params[0]: _Source(biases[0], _param_meta(params, biases[0]))}


def _bind(params: Mapping[str, Param], node: Node, step: Step, link: str | None) -> dict[str, _Source] | None:
    """The step's names -> what feeds them at this node, or None when the node does not fit the step."""
    if op_name(node) not in step.ops:
        return None
    if step.epilogue:
        return _bind_epilogue(params, node, step)
    inputs = list(zip(node.inputs, node.input_metas))
    if link is not None:
        at = [i for i, (name, _) in enumerate(inputs) if name == link]
        if not at or (at[0] != 0 and op_name(node) not in COMMUTATIVE):
            return None
        del inputs[at[0]]
    if len(inputs) != len(step.args) or len(node.params) != len(step.params):
        return None
    bound = {a: _Source(name, meta) for a, (name, meta) in zip(step.args, inputs)}
    bound.update({n: _Source(p, _param_meta(params, p)) for n, p in zip(step.params, node.params)})
    return bound


@dataclass(frozen=True, slots=True)
class _Match:
    members: tuple[Node, ...]
    bound: dict[str, _Source]


def _walk(params: Mapping[str, Param], readers: dict[str, list[Node]], start: Node, p: Pattern) -> _Match | None:
    """Follow the pattern's steps from ``start``, each step a reader of the previous member."""
    members: list[Node] = []
    bound: dict[str, _Source] = {}
    node: Node | None = start
    for i, step in enumerate(p.steps):
        if i > 0:
            prev = members[-1].name
            node = next((r for r in readers[prev] if op_name(r) in step.ops), None)
        got = None if node is None else _bind(params, node, step, members[-1].name if i else None)
        if got is None or any(bound.get(k, v) != v for k, v in got.items()):
            return None
        members.append(node)
        bound.update(got)
    return _Match(tuple(members), bound)


def _shapes_fit(p: Pattern, m: _Match) -> bool:
    out = m.members[-1].outputs[0].shape
    for arg in p.args:
        shape = m.bound[arg].meta.shape
        kind = p.broadcast_of(arg)
        if kind is Broadcast.FULL and shape != out:
            return False
        if kind is Broadcast.VECTOR and shape != out[-1:]:
            return False
        if kind is Broadcast.SUFFIX and (len(shape) > len(out) or shape != out[len(out) - len(shape):]):
            return False
    return True


def _inputs_outside(p: Pattern, m: _Match) -> bool:
    """No argument may be fed by a node of the chain itself (``silu(a) * silu(a)`` is not a SwiGLU of two
    inputs); an epilogue's argument is its matmul's output by design."""
    inside = {n.name for n in m.members}
    return all(m.bound[a].name not in inside for s in p.steps if not s.epilogue for a in s.args)


def _intermediates_private(p: Pattern, m: _Match, readers: dict[str, list[Node]]) -> bool:
    """An intermediate that is not an output of the fused op must not be read outside the chain (nor
    may an epilogue's matmul output: fused, it no longer holds the bias)."""
    inside = {n.name for n in m.members}
    outs = p.output_steps()
    return all(i in outs or all(r.name in inside for r in readers[n.name]) for i, n in enumerate(m.members))


def _traffic(p: Pattern, m: _Match) -> tuple[sympy.Expr, sympy.Expr]:
    """(unfused, fused) bytes of the matched chain, by the module docstring's model."""
    unfused = sympy.Integer(0)
    for step, node in zip(p.steps, m.members):
        if step.epilogue:  # the bias add on its own: read the output and the bias, write the output
            unfused += 2 * node.outputs[0].nbytes + m.bound[step.params[0]].meta.nbytes
        else:
            unfused += node.bytes
    reads = {m.bound[a].name: m.bound[a].meta.nbytes for a in p.args}
    writes = [m.members[i].outputs[0].nbytes for _, i in p.outputs]
    return unfused, sympy.Add(*reads.values()) + sympy.Add(*writes)


@functools.lru_cache(maxsize=4096)
def always_positive(expr: sympy.Expr) -> bool:
    """True when ``expr``, a polynomial in b and s, is positive for all b, s >= 1 (a sufficient test:
    no negative coefficient, one positive). Cached: every layer of a deep model asks about the same few
    expressions, and expanding each took a third of the fusion pass on 1024 layers."""
    expr = sympy.expand(expr)
    if expr.free_symbols - {BATCH, SEQ}:
        return False
    coeffs = sympy.Poly(expr, BATCH, SEQ).coeffs()
    return all(c >= 0 for c in coeffs) and any(c > 0 for c in coeffs)


def _fusion(graph: Graph, p: Pattern, m: _Match, block_of: dict[str, str]) -> Fusion:
    unfused, fused = _traffic(p, m)
    return Fusion(pattern=p.name, nodes=tuple(n.name for n in m.members),
                  args=tuple((a, m.bound[a].name) for a in p.args),
                  outputs=tuple((o, m.members[i].name) for o, i in p.outputs),
                  expr=p.expression if p.kind is Kind.ELEMENTWISE else None,
                  unfused_bytes=unfused, fused_bytes=fused, block=block_of.get(m.members[0].name, ""))


def find_fusions(graph: Graph, patterns: Sequence[Pattern] = PATTERNS) -> tuple[Fusion, ...]:
    """Every chain of ``graph`` that matches a pattern and saves bytes, in graph order; a node joins
    at most one fusion, the first pattern's in ``patterns`` order."""
    readers: dict[str, list[Node]] = defaultdict(list)
    for node in graph.nodes:
        for name in dict.fromkeys(node.inputs):
            readers[name].append(node)
    block_of = {n: b.name for b in graph.blocks for n in b.nodes}
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    params = {q.name: q for q in graph.params}  # by name: a scan per lookup made a deep model quadratic
    taken: set[str] = set()
    found: list[Fusion] = []
    for p in patterns:
        for start in graph.nodes:
            m = _walk(params, readers, start, p)
            if m is None or taken & {n.name for n in m.members}:
                continue
            if not (_shapes_fit(p, m) and _inputs_outside(p, m) and _intermediates_private(p, m, readers)):
                continue
            fusion = _fusion(graph, p, m, block_of)
            if always_positive(fusion.saved_bytes):
                found.append(fusion)
                taken.update(fusion.nodes)
    return tuple(sorted(found, key=lambda f: position[f.nodes[0]]))


def fusion_names(fusions: Sequence[Fusion]) -> tuple[str, ...]:
    """The distinct pattern names, sorted: what ``ir.Plan.fusions`` records."""
    return tuple(sorted({f.pattern for f in fusions}))


def saved_bytes(fusions: Sequence[Fusion]) -> sympy.Expr:
    """Forward bytes all ``fusions`` save together, an expression in b and s."""
    return sympy.expand(sympy.Add(*(f.saved_bytes for f in fusions)))
