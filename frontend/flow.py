"""``Flow``: a traced graph's dataflow joined with the model's module tree, for ``structure``.

Walks upstream and downstream over node inputs (nearest first), and says which nodes are
projections (a matmul reading a parameter of 2 or more dims) and norms (a norm op, or an
elementwise op reading its module's 1-D parameter in a module that also reduces: Hugging Face's
RMSNorm is pow, mean, rsqrt, mul), and which module a projection belongs to.
"""
from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Iterator

from torch import nn

from ..ir import Graph, Node, OpKind

CASTS = frozenset({"aten.to.dtype", "aten._to_copy.default", "aten.to.dtype_layout"})  # dtype casts, no math


def owner(param: str) -> str:
    """The module path that owns a parameter (``a.b.weight`` -> ``a.b``)."""
    return param.rsplit(".", 1)[0] if "." in param else ""


def common_module(paths: Iterable[str]) -> str:
    """The deepest module that holds every path."""
    split = [p.split(".") if p else [] for p in paths]
    if not split:
        return ""
    common = []
    for parts in zip(*split):
        if any(p != parts[0] for p in parts):
            break
        common.append(parts[0])
    return ".".join(common)


class Flow:
    """The graph's dataflow with the module tree: walks up and down, projections, norms."""

    def __init__(self, model: nn.Module, graph: Graph) -> None:
        self.graph = graph
        self.by_name = {n.name: n for n in graph.nodes}
        self.order = {n.name: i for i, n in enumerate(graph.nodes)}
        self.users: dict[str, list[str]] = defaultdict(list)
        for n in graph.nodes:
            for i in n.inputs:
                self.users[i].append(n.name)
        self.shapes = {p.name: p.shape for p in graph.params}
        self.modules = dict(model.named_modules())
        self.reducing = {n.module_path for n in graph.nodes if n.op in (OpKind.REDUCTION, OpKind.NORM)}

    def walk(self, start: Iterable[str], within: set[str] | None, up: bool,
             stop_at_projection: bool = False) -> Iterator[Node]:
        """Nodes reached from ``start`` (excluded), nearest first, staying in ``within``."""
        seen, frontier = set(start), deque(start)
        while frontier:
            name = frontier.popleft()
            node = self.by_name.get(name)
            if node is None:
                continue
            for nxt in (node.inputs if up else self.users.get(name, ())):
                if nxt in seen or (within is not None and nxt not in within):
                    continue
                seen.add(nxt)
                found = self.by_name.get(nxt)
                if found is None:
                    continue
                yield found
                if not (stop_at_projection and self.is_projection(found)):
                    frontier.append(nxt)

    def is_projection(self, node: Node) -> bool:
        return node.op == OpKind.MATMUL and self.weight(node) is not None

    def _heavy(self, node: Node) -> str | None:
        return next((p for p in node.params if len(self.shapes.get(p, ())) >= 2), None)

    def weight(self, node: Node) -> str | None:
        """The parameter of 2 or more dims a matmul reads, directly or through views (``w.t()``, ``w[e]``)
        and dtype casts (DeepSeek-V3's router runs ``F.linear(x.float(), self.weight.float())``)."""
        direct = self._heavy(node)
        if direct is not None or node.op != OpKind.MATMUL:
            return direct
        for start in node.inputs[:3]:
            producer = self.by_name.get(start)
            for _ in range(3):
                if producer is None or not (producer.op == OpKind.VIEW or producer.target in CASTS):
                    break
                found = self._heavy(producer)
                if found is not None:
                    return found
                producer = self.by_name.get(producer.inputs[0]) if producer.inputs else None
        return None

    def weight_in_out(self, node: Node) -> bool:
        """The matmul reads its 2-D weight as (in, out) itself, not through ``aten.linear``'s (out, in)
        nor a transposing view: GPT-2's ``Conv1D`` (``addmm(bias, x, weight)``)."""
        direct = self._heavy(node)
        return direct is not None and len(self.shapes[direct]) == 2 and "linear" not in node.target

    def module_of(self, node: Node) -> str:
        """The module of a node reading parameters: its own module when that holds parameters (a tied
        ``lm_head``, an ``nn.Embedding``), else the owner of the (weight) parameter it reads."""
        own = self.modules.get(node.module_path)
        if own is not None and any(True for _ in own.parameters(recurse=False)):
            return node.module_path
        weight = self.weight(node) or (node.params[0] if node.params else "")
        return owner(weight)

    def is_norm(self, node: Node) -> bool:
        if node.op == OpKind.NORM:
            return True
        return (node.op == OpKind.ELEMENTWISE and node.module_path in self.reducing
                and any(len(self.shapes.get(p, ())) == 1 and owner(p) == node.module_path for p in node.params))

    def norm_before(self, node: Node, within: set[str] | None) -> str:
        """The norm module nearest upstream of a node's activation input, not past a projection."""
        start = [self.by_name[i] for i in node.inputs[:1] if i in self.by_name]
        for found in (*start, *self.walk(node.inputs[:1], within, up=True, stop_at_projection=True)):
            if self.is_projection(found) or found.op == OpKind.ATTENTION:
                continue
            if self.is_norm(found):
                return found.module_path
        return ""

    def projection(self, start: str, within: set[str], up: bool) -> Node | None:
        node = self.by_name.get(start)
        if up and node is not None and self.is_projection(node):
            return node
        return next((n for n in self.walk([start], within, up=up) if self.is_projection(n)), None)
