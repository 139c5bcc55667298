"""Lower an exported program (aten ops on fake tensors) to ``ir.Node`` values.

Each call of an aten op becomes one node: its kind and cost from ``op_rules``, its shapes in b and
s from ``symbolic``, its owning module from ``nn_module_stack``, and the parameters it reads by
their fully qualified names. A leaf op (``meshplan::leaf``) becomes one node with its rule's
declared cost and every parameter of its module.

Graph inputs: the token input is a node (kind ``other``, target ``input``); a buffer or lifted
constant is a node (target ``buffer``) placed just before its first reader when it lives inside a
repeated layer, at the top otherwise; parameters are not nodes, nodes name them in ``params``.
A node's ``inputs`` name the nodes whose outputs it reads, in argument order, and ``input_metas``
are those outputs' metas, one for one; parameters are not among them (``params`` names them, and
the graph's ``Param`` values give their shapes). Node names are stable across traces: ``{block}/{op}_{i}`` inside a repeated layer
(``layers.3/linear_2``) and ``{op}_{i}`` outside, counted per block, so that a layer traced alone and
the same layer in a full trace get the same names.
"""
from __future__ import annotations

import operator
import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import fx

from ..ir import Node, OpKind, TensorMeta, UnsupportedModelError
from .export import Exported
from .leaves import Leaf, LeafCost
from .op_rules import FOREIGN_MATMULS, rule_for, op_bytes
from .symbolic import SymbolMap


@dataclass(frozen=True, slots=True, kw_only=True)
class Lowered:
    nodes: tuple[Node, ...]
    leaf_costs: Mapping[str, LeafCost]  # node name -> the leaf's declared cost


def scope_of(module_path: str, scopes: frozenset[str]) -> str:
    """The repeated layer (``layers.3``) that owns a module path, or "" outside every layer."""
    parts = module_path.split(".")
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if prefix in scopes:
            return prefix
    return ""


def module_path_of(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    if path.startswith("_empty_nn_module_stack"):
        return ""
    return re.sub(r"@\d+$", "", path)


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def canonical_params(model: torch.nn.Module) -> dict[str, str]:
    """Every name a parameter is reachable by -> the name ``named_parameters()`` gives it (tied weights)."""
    first: dict[int, str] = {}
    names: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names[name] = first.setdefault(id(p), name)
    return names


@dataclass(frozen=True, slots=True, kw_only=True)
class _Reads:
    """What one node reads: producers (nodes) and their metas; every tensor read, parameters included."""

    names: tuple[str, ...]
    metas: tuple[TensorMeta, ...]
    all_metas: tuple[TensorMeta, ...]
    params: tuple[str, ...]


@dataclass(slots=True)
class _Lowering:
    exported: Exported
    symbols: SymbolMap
    scopes: frozenset[str]
    canonical: dict[str, str]
    nodes: list[Node] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # fx name -> ir name
    metas: dict[str, TensorMeta] = field(default_factory=dict)  # fx name -> its tensor's meta
    multi: dict[str, tuple[TensorMeta, ...]] = field(default_factory=dict)  # fx name -> tuple outputs
    params: dict[str, str] = field(default_factory=dict)  # fx name -> parameter FQN
    pending: dict[str, Node] = field(default_factory=dict)  # fx name -> buffer node not yet placed
    counters: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    leaf_costs: dict[str, LeafCost] = field(default_factory=dict)

    def name(self, scope: str, base: str) -> str:
        i = self.counters[scope][base]
        self.counters[scope][base] += 1
        return f"{scope}/{base}_{i}" if scope else f"{base}_{i}"

    def placeholder(self, node: fx.Node) -> None:
        sig = self.exported.program.graph_signature
        val = node.meta.get("val")
        if node.name in sig.inputs_to_parameters:
            self.params[node.name] = self.canonical.get(sig.inputs_to_parameters[node.name],
                                                        sig.inputs_to_parameters[node.name])
            self.metas[node.name] = self.symbols.meta(val, node.name)
            return
        if not isinstance(val, torch.Tensor):
            return
        meta = self.symbols.meta(val, node.name)
        self.metas[node.name] = meta
        if node.name in sig.user_inputs:
            self.emit(node.name, Node(name=node.name, op=OpKind.OTHER, target="input", outputs=(meta,)))
            return
        fqn = {**sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}.get(node.name, node.name)
        owner = fqn.rsplit(".", 1)[0] if "." in fqn else ""
        buffer = Node(name=fqn, op=OpKind.OTHER, target="buffer", outputs=(meta,), module_path=owner)
        if scope_of(owner, self.scopes):
            self.pending[node.name] = buffer  # placed before its first reader, inside its layer
        elif node.users:
            self.emit(node.name, buffer)

    def emit(self, fx_name: str, node: Node) -> None:
        self.names[fx_name] = node.name
        self.nodes.append(node)

    def arg_nodes(self, node: fx.Node) -> list[fx.Node]:
        """Tensor-valued fx nodes among the arguments, in order, repeats kept."""
        found: list[fx.Node] = []
        fx.node.map_arg((node.args, node.kwargs), found.append)
        return [a for a in found if a.name in self.metas or a.name in self.multi]

    def inputs_of(self, node: fx.Node) -> _Reads:
        names, metas, all_metas, params = [], [], [], []
        for arg in self.arg_nodes(node):
            if arg.name in self.pending:
                self.emit(arg.name, self.pending.pop(arg.name))
            if arg.name in self.params:
                params.append(self.params[arg.name])
            elif arg.name in self.names:
                names.append(self.names[arg.name])
                metas.append(self.metas[arg.name])
            if arg.name in self.metas:
                all_metas.append(self.metas[arg.name])
        return _Reads(names=tuple(names), metas=tuple(metas), all_metas=tuple(all_metas),
                      params=tuple(dict.fromkeys(params)))

    def call(self, node: fx.Node) -> None:
        outs = _tensors(node.meta.get("val"))
        if not outs:
            return  # symbolic sizes, asserts: no tensor, no cost
        where = node.name
        out_metas = tuple(self.symbols.meta(t, where) for t in outs)
        if node.target is operator.getitem:
            self.getitem(node, out_metas[0])
        elif node.target is torch.ops.meshplan.leaf.default:
            self.leaf(node, out_metas)
        else:
            self.aten(node, out_metas)
        if isinstance(node.meta.get("val"), torch.Tensor):
            self.metas[node.name] = out_metas[0]
        else:
            self.multi[node.name] = out_metas

    def getitem(self, node: fx.Node, out: TensorMeta) -> None:
        producer = node.args[0]
        path = module_path_of(node)
        self.emit(node.name, Node(
            name=self.name(scope_of(path, self.scopes), "getitem"), op=OpKind.VIEW, target="getitem",
            inputs=(self.names[producer.name],), input_metas=(out,), outputs=(out,), module_path=path))

    def aten(self, node: fx.Node, outs: tuple[TensorMeta, ...]) -> None:
        target = node.target
        op_name = getattr(target, "_opname", getattr(target, "__name__", str(target)))
        is_aten = isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"
        rule = rule_for(op_name if is_aten or op_name in FOREIGN_MATMULS else "")
        reads = self.inputs_of(node)
        path = module_path_of(node)
        self.emit(node.name, Node(
            name=self.name(scope_of(path, self.scopes), op_name), op=rule.kind, target=str(target),
            inputs=reads.names, input_metas=reads.metas, outputs=outs, flops=rule.flops(reads.all_metas, outs),
            bytes=op_bytes(rule, reads.all_metas, outs), module_path=path, params=reads.params))

    def leaf(self, node: fx.Node, outs: tuple[TensorMeta, ...]) -> None:
        path = node.args[1]
        leaf: Leaf = self.exported.leaves[path]
        reads = self.inputs_of(node)
        try:
            cost = leaf.rule.cost(leaf.module, reads.metas, outs)
        except Exception as err:  # noqa: BLE001 - a user's rule failing is a model problem
            raise UnsupportedModelError(f"the leaf rule for {leaf.cls_name} failed on module {path!r}: "
                                        f"{type(err).__name__}: {err}; fix the rule's cost function") from err
        params = tuple(dict.fromkeys(self.canonical.get(n, n) for n, _ in
                                     leaf.module.named_parameters(prefix=path, remove_duplicate=False)))
        name = self.name(scope_of(path, self.scopes), type(leaf.module).__name__)
        self.leaf_costs[name] = cost
        self.emit(node.name, Node(
            name=name, op=leaf.rule.op, target=type(leaf.module).__name__, inputs=reads.names, input_metas=reads.metas,
            outputs=outs, flops=cost.flops, bytes=cost.bytes, module_path=path, params=params, leaf=True))


def lower(exported: Exported, scopes: frozenset[str]) -> Lowered:
    """The exported program as IR nodes in topological order; ``scopes`` are the repeated layers."""
    graph = exported.program.graph
    user = [n for n in graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
            and n.name in exported.program.graph_signature.user_inputs]
    symbols = SymbolMap.from_tokens(user[0].meta["val"], exported.sequence, exported.specialized)
    state = _Lowering(exported=exported, symbols=symbols, scopes=scopes,
                      canonical=canonical_params(exported.model))
    for node in graph.nodes:
        if node.op == "placeholder":
            state.placeholder(node)
        elif node.op == "call_function":
            state.call(node)
    return Lowered(nodes=tuple(state.nodes), leaf_costs=dict(state.leaf_costs))
