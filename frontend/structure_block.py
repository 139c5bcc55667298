"""The roles inside one repeated block: attention, its projections and norm, the MLP or the experts.

The rules are those of ``structure``'s docstring; paths come back relative to the block
(``self_attn.q_proj``), and what cannot be used becomes a note naming ``{container}.*.{path}``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..ir import Block, Node, OpKind
from .blocks import rebase
from .flow import Flow, common_module, owner


class _Block:
    """One block's nodes and how to name its modules."""

    def __init__(self, flow: Flow, block: Block, container: str) -> None:
        self.flow = flow
        self.block = block
        self.within = set(block.nodes)
        self.nodes = [flow.by_name[n] for n in block.nodes]
        self.star = f"{container}.*" if container else "*"

    def rel(self, path: str) -> str:
        found = rebase(path, self.block.name, "") if path else None
        return found.lstrip(".") if found is not None else ""

    def where(self, rel: str) -> str:
        return f"{self.star}.{rel}" if rel else self.star

    def upstream(self, node: Node) -> set[str]:
        return {n.name for n in self.flow.walk([node.name], self.within, up=True)}

    def downstream(self, node: Node) -> set[str]:
        return {n.name for n in self.flow.walk([node.name], self.within, up=False)}

    def path(self, sublayer: str) -> str:
        """The model path of the module at ``sublayer`` (relative to the block; "" is the block)."""
        return f"{self.block.name}.{sublayer}" if sublayer else self.block.name

    def param_shape(self, sublayer: str, name: str) -> tuple[int, ...]:
        """The shape of parameter ``name`` of the module at ``sublayer`` (relative to the block); () if none."""
        module = self.flow.modules.get(self.path(sublayer))
        param = getattr(module, name, None) if module is not None else None
        return tuple(param.shape) if isinstance(param, torch.Tensor) else ()

    def norm_input(self, path: str) -> tuple | None:
        """The input shape of the norm module at model ``path`` (its first node's activation); None where the
        module is not a norm (no reduction among its nodes) or has no such node."""
        if path not in self.flow.reducing:
            return None
        first = next((n for n in self.nodes if n.module_path == path and n.input_metas), None)
        return tuple(first.input_metas[0].shape) if first is not None else None


def block_roles(flow: Flow, block: Block, container: str) -> tuple[dict, list[str]]:
    """The role fields of ``ModelStructure`` found in ``block``, and notes."""
    b = _Block(flow, block, container)
    roles: dict = {}
    notes: list[str] = []
    core = _core(b)
    taken: set[str] = set()
    if core is None:
        notes.append(f"{b.star}: no attention (scaled_dot_product_attention, or softmax(q @ k^T) @ v) in the "
                     "block; tensor parallelism of attention is not offered")
    else:
        taken = _attention(b, core, roles, notes) | b.upstream(core.out)
    rest = [n for n in b.nodes if flow.is_projection(n) and n.name not in taken]
    leaves = [n for n in b.nodes if n.leaf and n.params]
    grouped = [n for n in rest if len(flow.shapes[flow.weight(n)]) >= 3]
    if leaves or grouped:
        _experts(b, leaves, grouped, [n for n in rest if n not in grouped], roles, notes)
    else:
        _mlp(b, rest, roles, notes)
    placed = [roles[r] for r in ("attn", "mlp", "attn_norm", "mlp_norm") if roles.get(r)]
    if placed:
        roles["block_loose"] = tuple(dict.fromkeys(n.rpartition(".")[0] or n for n in _loose_params(b, "", placed)))
    kinds = {flow.weight_in_out(flow.by_name[n]) for n in roles.pop("_projections", ())}
    roles["linear_kind"] = "conv1d" if kinds == {True} else "linear"
    if kinds == {True, False}:
        notes.append(f"{b.star}: some projections store (in, out) weights and some (out, in); linear_kind says "
                     "'linear', so tensor parallelism of the (in, out) ones would be wrong: check the plan")
    return roles, notes


def _projection_path(b: _Block, node: Node) -> str:
    return b.rel(b.flow.module_of(node))


@dataclass(frozen=True, slots=True)
class _Core:
    """Attention's core: the nodes that hold q, k and v (b, heads, s, d), and the node of its output."""

    q: Node
    k: Node
    v: Node
    out: Node
    q_shape: tuple


def _core(b: _Block) -> _Core | None:
    """The attention op, or else eager attention written out (GPT-OSS, whose per-head sinks join the
    softmax): a matmul of two activations (q @ k^T) reaching a softmax, which reaches another (p @ v)."""
    flow = b.flow
    attn = next((n for n in b.nodes if n.op == OpKind.ATTENTION), None)
    if attn is not None and len(attn.inputs) >= 3:
        q, k, v = (flow.by_name.get(i) for i in attn.inputs[:3])
        if q is not None and k is not None and v is not None and attn.input_metas:
            return _Core(q=q, k=k, v=v, out=attn, q_shape=tuple(attn.input_metas[0].shape))
    products = [n for n in b.nodes if n.op == OpKind.MATMUL and flow.weight(n) is None and len(n.inputs) >= 2]
    for scores in products:
        below = b.downstream(scores)
        softmax = next((n for n in b.nodes if n.name in below and n.op == OpKind.SOFTMAX), None)
        values = next((n for n in products if softmax is not None and n.name in b.downstream(softmax)), None)
        if values is not None and scores.input_metas:
            q, k, v = (flow.by_name.get(i) for i in (*scores.inputs[:2], values.inputs[1]))
            if q is not None and k is not None and v is not None:
                return _Core(q=q, k=k, v=v, out=values, q_shape=tuple(scores.input_metas[0].shape))
    return None


def _attention(b: _Block, core: _Core, roles: dict, notes: list[str]) -> set[str]:
    """q/k/v (or qkv), o, attn, attn_norm and head_dim; returns the projections it took."""
    flow = b.flow
    attn = core.out
    qkv = [flow.projection(n.name, b.within, up=True) for n in (core.q, core.k, core.v)]
    o = flow.projection(attn.name, b.within, up=False)
    found = [n for n in (*qkv, o) if n is not None]
    paths = {n.name: _projection_path(b, n) for n in found}
    last = core.q_shape[-1] if core.q_shape else 0
    roles["head_dim"] = int(last) if getattr(last, "is_Integer", False) else 0
    if any(n is None for n in qkv):
        notes.append(f"{b.where(b.rel(attn.module_path))}: no projection found upstream of attention's q, k or v; "
                     "tensor parallelism keeps attention replicated")
    elif len({n.name for n in qkv}) == 1:
        roles["qkv"] = paths[qkv[0].name]
        if _grouped_qkv(b, qkv[0], roles["head_dim"]):
            roles["qkv_grouped"] = True
        else:
            notes.append(f"{b.where(roles['qkv'])}: fused q/k/v projection whose output is not laid out by heads "
                         "(q, k and v each whole, side by side, as Phi-3's and MPT's are: a row split would hand a "
                         "rank all of q and none of v); tensor parallelism keeps attention replicated")
    elif len({n.name for n in qkv}) == 3:
        roles["q"], roles["k"], roles["v"] = (paths[n.name] for n in qkv)
    elif qkv[1] is qkv[2]:
        notes.append(f"{b.where(b.rel(attn.module_path))}: k and v come from one projection "
                     f"({paths[qkv[1].name]!r}) and q from another ({paths[qkv[0].name]!r}), as multi-head latent "
                     "attention makes them (DeepSeek-V2/V3: k and v up-projected from one compressed latent, "
                     "k's rotary part shared by all heads); tensor parallelism keeps attention replicated")
    else:
        notes.append(f"{b.where(b.rel(attn.module_path))}: q, k and v come from "
                     f"{sorted({paths[n.name] for n in qkv})}, neither one projection each nor one for all; "
                     "tensor parallelism keeps attention replicated")
    if o is not None:
        roles["o"] = paths[o.name]
    else:
        notes.append(f"{b.where(b.rel(attn.module_path))}: no projection after attention; tensor parallelism keeps "
                     "attention replicated")
    roles["attn"] = common_module([*paths.values(), b.rel(attn.module_path)])
    own = _loose_params(b, roles["attn"], paths.values())
    norms, dim = _head_norms(b, roles["attn"], own, roles["head_dim"])
    if norms:  # Qwen3's and Gemma 3's q_norm / k_norm: split with the heads, their weights replicated
        roles["head_norms"], roles["head_norm_dim"] = norms, dim
        own = []
    q_width, k_width = (_out_features(flow, n) for n in qkv[:2])
    if own and (feature := _feature_norms(b, roles["attn"], own, {q_width, k_width} - {0})):  # OLMo 2's q/k norms
        roles["feature_norms"] = feature
        own = []
    heads = q_width // roles["head_dim"] if roles["head_dim"] else 0
    if own and heads and all("." not in p and b.param_shape(roles["attn"], p)[:1] == (heads,) for p in own):
        roles["head_params"] = tuple(f"{roles['attn']}.{p}" if roles["attn"] else p for p in own)  # GPT-OSS's sinks
        own = []
    if own and "q" in roles:  # GPT-OSS's sinks (heads,), OLMo 2's q_norm / k_norm over all heads' features
        for role in ("q", "k", "v"):
            roles.pop(role)
        notes.append(f"{b.where(roles['attn'])}: attention holds parameters besides its projections' {own} "
                     "(per-head sinks, q/k norms over every head's features): split by heads, each tp rank would hold "
                     "a part of the sinks or normalize over its own heads only; tensor parallelism keeps attention "
                     "replicated")
    # the norm before the earliest projection feeding attention: MLA's q_b_proj reads its own q_a_layernorm,
    # the block's input norm is before q_a_proj
    above = b.upstream(attn)
    feeding = [n for n in b.nodes if n.name in above and flow.is_projection(n)]
    roles["attn_norm"] = b.rel(flow.norm_before(feeding[0], b.within)) if feeding else ""
    roles["_projections"] = tuple(paths)
    return set(paths)


def _mlp(b: _Block, rest: Sequence[Node], roles: dict, notes: list[str]) -> None:
    """mlp_in (projections no other one feeds), mlp_out (the one they feed), mlp, mlp_norm."""
    if not rest:
        notes.append(f"{b.star}: no projection besides attention's; no MLP to split by tensor parallelism")
        return
    below = {n.name: b.downstream(n) for n in rest}
    fed = [n for n in rest if any(n.name in below[m.name] for m in rest if m is not n)]
    ins = [n for n in rest if n not in fed]
    outs = [n for n in fed if all(n.name not in below[m.name] for m in fed if m is not n)]
    paths = [_projection_path(b, n) for n in rest]
    if len(outs) != 1 or len(fed) != 1:
        notes.append(f"{b.where(common_module(paths))}: projections {paths} are not inputs feeding one output "
                     "projection; tensor parallelism keeps this MLP replicated")
        return
    roles["mlp"] = common_module(paths)
    roles["mlp_norm"] = b.rel(b.flow.norm_before(ins[0], b.within))
    roles["_projections"] = roles.get("_projections", ()) + tuple(n.name for n in rest)
    if len(ins) == 1 and (cut := _feature_cut(b, ins[0], outs[0])) is not None:
        notes.append(f"{b.where(roles['mlp'])}: {_projection_path(b, ins[0])}'s output features are cut apart "
                     f"({cut.target}) before {_projection_path(b, outs[0])}, as a fused gate and up projection's are "
                     "(Phi-3, GLM); splitting its rows over tp would hand a rank whole gate rows and another whole "
                     "up rows, so tensor parallelism keeps this MLP replicated")
        return
    if own := _loose_params(b, roles["mlp"], paths):
        notes.append(f"{b.where(roles['mlp'])}: the MLP holds parameters besides its projections' {own} (Apertus's "
                     "xIELU slopes): with its features split over tp, each rank would reach only a partial sum of "
                     "their gradients; tensor parallelism keeps this MLP replicated")
        return
    roles["mlp_in"] = tuple(_projection_path(b, n) for n in ins)
    roles["mlp_out"] = _projection_path(b, outs[0])


def _loose_params(b: _Block, sublayer: str, projections: Iterable[str]) -> list[str]:
    """Parameters of the sublayer module at ``sublayer`` (relative to the block) that none of its ``projections``
    holds: computed on each tp rank's part of the heads or features once the projections are split, so each rank
    would hold a partial sum of their gradients (or a part of a per-head tensor)."""
    module = b.flow.modules.get(b.path(sublayer))
    if module is None:
        return []
    prefix = f"{sublayer}." if sublayer else ""
    owners = tuple(f"{p.removeprefix(prefix)}." for p in projections)
    return [name for name, _ in module.named_parameters() if not name.startswith(owners)]


def _out_features(flow: Flow, node: Node | None) -> int:
    """The output features of a projection with an (out, in) weight; 0 for none (or an (in, out) Conv1D)."""
    weight = flow.weight(node) if node is not None else None
    return int(flow.shapes[weight][0]) if weight and not flow.weight_in_out(node) else 0


def _grouped_qkv(b: _Block, projection: Node, head_dim: int) -> bool:
    """A fused q/k/v projection whose output (..., width) is read first by a view into (..., groups, per group...)
    with more than one head's width a group: each head's (or kv group's) q, k and v side by side, as GPT-NeoX's
    ``view(b, s, -1, 3 * head_dim)`` and Falcon's ``view(b, s, -1, heads_per_kv + 2, head_dim)``, so a split of its
    rows hands a tp rank whole groups. Not Phi-3's or MPT's (q, k and v cut from the whole width) nor Falcon's
    multi-query ``view(b, s, heads + 2, head_dim)`` (q's heads, then k, then v). Whether the view takes the group
    count from the width it gets (``-1``) is the head-split probe's question (``frontend/head_split.py``)."""
    users = b.flow.users.get(projection.name, [])
    if head_dim <= 0 or len(users) != 1 or not projection.outputs:
        return False
    view = b.flow.by_name.get(users[0])
    if view is None or view.op != OpKind.VIEW or "view" not in view.target and "reshape" not in view.target:
        return False
    whole, out = tuple(projection.outputs[0].shape), tuple(view.outputs[0].shape) if view.outputs else ()
    lead = len(whole) - 1
    if len(out) < lead + 2 or out[:lead] != whole[:lead]:
        return False
    tail = out[lead + 1:]
    if not all(getattr(x, "is_Integer", False) for x in (whole[-1], out[lead], *tail)):
        return False
    group = 1
    for x in tail:
        group *= int(x)
    return int(out[lead]) * group == int(whole[-1]) and group % head_dim == 0 and group >= 2 * head_dim


def _head_norms(b: _Block, attn: str, params: Sequence[str], head_dim: int) -> tuple[tuple[str, ...], int]:
    """The modules holding ``params`` (attention's own, beside its projections) when each is a norm over one head's
    features: its parameters (head_dim,), its input (..., heads, ..., head_dim) with the heads the one fixed dim
    before the last (Qwen3's q_norm on (b, s, heads, head_dim), Gemma 3's on (b, heads, s, head_dim)); with the
    heads' dim, the same for all. ((), 0) when any is not: GPT-OSS's per-head sinks (heads,), OLMo 2's q_norm over
    all heads' features (heads * head_dim,), which a split by heads would change."""
    if not params or head_dim <= 0:
        return (), 0
    norms = _norms(b, attn, params)
    dims = set()
    for module, shape in norms.values():
        fixed = [i for i, size in enumerate(shape[:-1]) if getattr(size, "is_Integer", False)]
        if (any(tuple(p.shape) != (head_dim,) for p in module.parameters()) or len(shape) < 3
                or shape[-1] != head_dim or len(fixed) != 1):
            return (), 0
        dims.add(fixed[0])
    if len(dims) != 1:
        return (), 0
    return tuple(norms), dims.pop()


def _feature_norms(b: _Block, attn: str, params: Sequence[str], widths: set[int]) -> tuple[str, ...]:
    """The modules holding ``params`` (attention's own, beside its projections) when each is a norm over a q or k
    projection's whole output (``widths``: their output features): parameters (width,), input (..., width), as
    OLMo 2's q_norm / k_norm over every head's q / k. Split over tp as the projection's output is, each rank's
    part of the weight meets its part of the features. () when any is not."""
    norms = _norms(b, attn, params)
    for module, shape in norms.values():
        sizes = {tuple(p.shape) for p in module.parameters()}
        if len(sizes) != 1 or len(width := next(iter(sizes))) != 1:
            return ()
        if width[0] not in widths or len(shape) != 3 or shape[-1] != width[0]:
            return ()
    return tuple(norms)


def _norms(b: _Block, attn: str, params: Sequence[str]) -> dict[str, tuple[nn.Module, tuple]]:
    """Path (relative to the block) -> (module, input shape) of each module holding ``params`` (attention's own,
    beside its projections, relative to it), when every one is a norm submodule of attention with a traced input;
    {} when any is not (a parameter attention holds itself, GPT-OSS's sinks)."""
    out = {}
    for rel in dict.fromkeys(p.rpartition(".")[0] for p in params):
        path = b.path(f"{attn}.{rel}" if attn else rel)
        module, shape = b.flow.modules.get(path), b.norm_input(path)
        if not rel or module is None or shape is None:
            return {}
        out[f"{attn}.{rel}" if attn else rel] = (module, shape)
    return out


def _feature_cut(b: _Block, first: Node, last: Node) -> Node | None:
    """A node between ``first`` and ``last`` whose output has fewer last-dim features than its input (a
    ``chunk``/``split``/slice of the projection's output: a fused gate and up projection), or None."""
    between = b.downstream(first) & b.upstream(last)
    for node in b.nodes:
        if node.name not in between or not node.input_metas or not node.outputs:
            continue
        shape_in, shape_out = node.input_metas[0].shape, node.outputs[0].shape
        if not shape_in or len(shape_in) != len(shape_out):
            continue
        width_in, width_out = shape_in[-1], shape_out[-1]  # sympy: a number, or a symbol (b, s)
        if getattr(width_in, "is_Integer", False) and getattr(width_out, "is_Integer", False) and width_out < width_in:
            return node
    return None


def _experts(b: _Block, leaves: Sequence[Node], grouped: Sequence[Node], others: Sequence[Node],
             roles: dict, notes: list[str]) -> None:
    """experts, router, mlp and mlp_norm of a MoE block (a leaf op, or matmuls over 3-D weights)."""
    flow = b.flow
    if leaves:
        leaf = leaves[0]
        experts, count, inner_router = _leaf_experts(flow, leaf)
        sinks = [leaf]
    else:
        weights = [flow.weight(n) for n in grouped]
        experts, count, inner_router = common_module(owner(w) for w in weights), flow.shapes[weights[0]][0], ""
        sinks = list(grouped)
    if not experts:
        notes.append(f"{b.where(b.rel(leaves[0].module_path))}: a leaf op without grouped (3-D) expert weights or "
                     "a list of experts; expert parallelism is not offered")
        return
    feeding = set().union(*(b.upstream(s) for s in sinks))
    router = next((n for n in others if n.name in feeding and _width(n) == count), None)
    router_path = inner_router or (_projection_path(b, router) if router is not None else "")
    roles["experts"] = b.rel(experts)
    roles["router"] = b.rel(router_path) if inner_router else router_path
    if not roles["router"]:
        notes.append(f"{b.where(roles['experts'])}: no router (a projection to {count} expert scores) found; "
                     "expert parallelism is offered without it")
    roles["mlp"] = common_module([p for p in (roles["experts"], roles["router"]) if p])
    entry = router if router is not None else sinks[0]
    roles["mlp_norm"] = b.rel(flow.norm_before(entry, b.within))
    # a shared expert reads the MoE's input beside the routed experts: not upstream of them (as attention is)
    shared = [_projection_path(b, n) for n in others if n is not router and n.name not in feeding]
    if shared:
        roles["shared_experts"] = common_module(shared)
        notes.append(f"{b.where(roles['shared_experts'])}: projections {shared} beside the routed experts (a "
                     "shared expert) are data-parallel, and stay whole under tensor parallelism")


def _width(node: Node) -> int:
    last = node.outputs[0].shape[-1] if node.outputs and node.outputs[0].shape else 0
    return int(last) if getattr(last, "is_Integer", False) else -1


def _leaf_experts(flow: Flow, leaf: Node) -> tuple[str, int, str]:
    """(experts path, expert count, router path inside the leaf or "") of a MoE leaf op."""
    three = [p for p in leaf.params if len(flow.shapes[p]) >= 3]
    if three:
        experts, count = common_module(owner(p) for p in three), flow.shapes[three[0]][0]
    else:
        module = flow.modules.get(leaf.module_path)
        lists = [(name, m) for name, m in module.named_modules() if name and hasattr(m, "__len__")
                 and len(m) > 1 and len({type(c) for c in m.children()}) == 1] if module is not None else []
        if not lists:
            return "", 0, ""
        name, found = lists[0]
        experts, count = f"{leaf.module_path}.{name}", len(found)
    router = next((owner(p) for p in leaf.params if len(flow.shapes[p]) == 2 and flow.shapes[p][0] == count
                   and not (owner(p) + ".").startswith(experts + ".")), "")
    return experts, count, router
