"""``find_structure``: the role of each module of a user's model, from the traced graph's dataflow.

Names are never read for meaning; a module's path is only what the roles point at. In the first
block (a child of the repeated container, ``blocks``), and then outside the blocks:

    projection  a matmul that reads a parameter of 2 or more dims; its module is the node's own when
                that module holds parameters, else the parameter's owner (a tied head is ``lm_head``)
    q, k, v     the nearest projection upstream of the attention op's inputs 0, 1, 2; one projection
                for all three is ``qkv`` (fused); ``o`` the nearest projection downstream of it;
                ``attn`` the deepest module holding those and the attention op
    norm        the nearest module upstream of a projection's input (not past another projection)
                that runs a norm op, or a reduction and a 1-D parameter (Hugging Face's RMSNorm)
    experts     the leaf op's module (data-dependent routing) or the owner of the 3-D parameters
                that matmuls read; E its experts (dim 0, or the ModuleList's length)
    router      a projection with E outputs that feeds the experts (inside a MoE leaf: its 2-D
                parameter with E rows)
    mlp_in/out  the other projections of the block not upstream of attention: those downstream of
                none of the others are the inputs (gate, up / fc), the one downstream is the output
    embed       an embedding read by the model's first input; ``pos_embed`` an embedding whose
                indices do not come from it (``arange``)
    head        the last projection after the blocks; ``tied_head`` when it reads the embedding's
                parameter; ``final_norm`` the norm before it
    loose       the modules outside the blocks holding parameters that are none of the above (BLOOM's
                ``word_embeddings_layernorm``): no pipeline stage is known to hold them
    head_dim    the last dim of the attention op's q; ``linear_kind`` "conv1d" when a projection's
                weight is (in, out) (GPT-2's ``Conv1D``: ``addmm(bias, x, weight)``)

What is not found is left empty, with a note (module path, reason, what it costs the plan).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from torch import nn

from ..ir import Block, Graph, ModelStructure, Node, OpKind
from .flow import Flow, owner
from .structure_block import block_roles

_NO_BLOCKS = ("no repeated block (an nn.ModuleList or nn.ModuleDict of alike layers holding parameters) was "
              "found; tensor and pipeline parallelism are not offered, data parallelism and ZeRO are")


def _container(blocks: Sequence[Block]) -> tuple[str, tuple[Block, ...], list[str]]:
    """The container holding the most blocks, its blocks, and notes about any other container."""
    groups: dict[str, list[Block]] = defaultdict(list)
    for b in blocks:
        groups[owner(b.name)].append(b)
    if not groups:
        return "", (), [_NO_BLOCKS]
    path = max(groups, key=lambda p: len(groups[p]))
    others = [f"{p}: {len(bs)} more repeated blocks besides {path!r}; plans split only {path!r}"
              for p, bs in groups.items() if p != path]
    return path, tuple(groups[path]), others


def find_structure(model: nn.Module, graph: Graph) -> ModelStructure:
    """The roles of the model's modules (module docstring)."""
    flow = Flow(model, graph)
    container, blocks, notes = _container(graph.blocks)
    roles: dict = {}
    if blocks:
        roles, block_notes = _kind_roles(flow, blocks, container)
        notes += block_notes
    outer = _outer_roles(flow, graph, blocks)
    parts = [p for p in (container, outer.get("embed"), outer.get("pos_embed"), outer.get("final_norm"),
                         outer.get("head")) if p]
    loose = tuple(dict.fromkeys(name.rpartition(".")[0] or name for name, _ in model.named_parameters()
                                if not any(name.startswith(p + ".") for p in parts)))
    return ModelStructure(blocks=container, num_blocks=len(blocks), **outer, **roles, loose=loose if blocks else (),
                          notes=tuple(notes))


def _kind_roles(flow: Flow, blocks: Sequence[Block], container: str) -> tuple[dict, list[str]]:
    """The roles of the first block of each kind, as one set: when some kinds have experts and others a
    plain MLP (DeepSeek-V3's leading dense layers), the experts' roles, with the other blocks listed in
    ``dense_blocks``; blocks whose attention has other modules than the roles name (MiniMax's lightning attention)
    in ``whole_attn_blocks``; other differences are noted, and the first block's roles stand."""
    firsts: dict[str, Block] = {}
    for b in blocks:
        firsts.setdefault(b.kind, b)
    found = {kind: block_roles(flow, b, container) for kind, b in firsts.items()}
    moe = [kind for kind in firsts if found[kind][0].get("experts")]
    first = blocks[0].kind
    kind = next((k for k in moe if k == first), moe[0] if moe else first)
    roles, notes = found[kind]
    roles, notes = dict(roles), list(notes)
    dense = tuple(i for i, b in enumerate(blocks) if b.kind not in moe) if moe else ()
    if dense:
        roles["dense_blocks"] = dense
        notes.append(f"{container}: blocks {list(dense)} have a plain MLP where the other {len(blocks) - len(dense)} "
                     f"have experts ({roles['experts']}); expert parallelism splits only those, and tensor "
                     "parallelism keeps the plain MLPs whole")
    attention = ("attn", "q", "k", "v", "qkv", "qkv_grouped", "o", "head_dim", "head_norms", "head_norm_dim",
                 "feature_norms", "head_params")
    # a kind whose attention has other modules than the roles name keeps it whole over tp; one that differs only in
    # its head width (Gemma 4's full-attention layers, 512 where the sliding ones have 256) is split at its own width
    differ = [k for k in firsts if any(found[k][0].get(r) != roles.get(r) for r in attention if r != "head_dim")]
    wider = [k for k in firsts if k not in differ and found[k][0].get("head_dim") != roles.get("head_dim")]
    if differ:
        roles["whole_attn_blocks"] = tuple(i for i, b in enumerate(blocks) if b.kind in differ)
        notes.append(f"{container}: the attention of blocks {list(roles['whole_attn_blocks'])} (kind {differ}) "
                     f"has other modules than {firsts[kind].name}'s, whose roles stand; tensor parallelism keeps "
                     "their attention whole")
    if wider:
        notes.append(f"{container}: the heads of blocks of kind {wider} are "
                     f"{', '.join(str(found[k][0].get('head_dim')) for k in wider)} wide where {firsts[kind].name}'s "
                     f"are {roles.get('head_dim')}; tensor parallelism splits each block's heads at their own width")
    if len(firsts) > 1 and not dense and not differ and not wider:
        notes.append(f"{container}: blocks of {len(firsts)} kinds ({', '.join(sorted(firsts))}); roles are those "
                     f"of {firsts[kind].name}, and plans treat the other kinds by their graph only")
    return roles, notes


def _outer_roles(flow: Flow, graph: Graph, blocks: Sequence[Block]) -> dict:
    """Embedding, position embedding, final norm and head: the roles outside the blocks."""
    inside = {n for b in graph.blocks for n in b.nodes}
    outside = {n.name for n in graph.nodes if n.name not in inside}
    inputs = {n.name for n in graph.nodes if n.target == "input"}
    out: dict = {}
    embeds = [n for n in graph.nodes if n.name in outside and n.op == OpKind.EMBEDDING and n.params]

    def reads_input(node: Node) -> bool:
        return bool(inputs & set(node.inputs)) or any(u.name in inputs for u in flow.walk(node.inputs, None, up=True))
    token = next((e for e in embeds if reads_input(e)), None)
    if token is None:
        return out
    out["embed"] = flow.module_of(token)
    pos = next((e for e in embeds if e is not token and not reads_input(e)), None)
    if pos is not None:
        out["pos_embed"] = flow.module_of(pos)
    last_block = max((flow.order[n] for b in blocks for n in b.nodes), default=flow.order[token.name])
    heads = [n for n in graph.nodes if n.name in outside and flow.order[n.name] > last_block and flow.is_projection(n)]
    if heads:
        head = heads[-1]
        out["head"] = flow.module_of(head)
        out["tied_head"] = flow.weight(head) in token.params
        out["final_norm"] = flow.norm_before(head, outside)
    return out
