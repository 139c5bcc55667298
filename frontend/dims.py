"""The model's transformer dimensions (``ir.ModelDims``): from its config, else from its graph.

From a config (``model.config``), by field name: the zoo's ``ModelConfig`` names first, then the
usual Hugging Face names (``CONFIG_NAMES``). From a traced graph, when there is no config:

    vocab, hidden   the embedding table's (rows, columns)
    layers          the number of repeated layers (blocks)
    heads, head_dim q of the first attention node, (b, heads, s, head_dim)
    kv_heads        width of the matmul that makes attention's k, / head_dim
    ffn_hidden      a MoE leaf's expert width, else the widest matmul of the first layer that does
                    not feed its attention
    family          "moe" with a MoE leaf, "llama" with rms_norm, "gpt" with layer_norm, else "custom"
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy

from ..ir import Block, ModelDims, Node, OpKind, Param, UnsupportedModelError
from .leaves import LeafCost

CONFIG_NAMES: Mapping[str, tuple[str, ...]] = {
    "family": ("family", "model_type"),
    "layers": ("layers", "num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden", "hidden_size", "n_embd", "d_model"),
    "heads": ("heads", "num_attention_heads", "n_head"),
    "kv_heads": ("kv_heads", "num_key_value_heads"),
    "ffn_hidden": ("ffn_hidden", "intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab", "vocab_size"),
    "experts": ("experts", "num_local_experts", "num_experts"),
    "top_k": ("top_k", "num_experts_per_tok"),
}
_REQUIRED = ("layers", "hidden", "heads", "vocab")


def _lookup(config: Any, names: Sequence[str]) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return None


def dims_from_config(config: Any) -> ModelDims:
    values = {f: _lookup(config, names) for f, names in CONFIG_NAMES.items()}
    missing = [f for f in _REQUIRED if not isinstance(values[f], int)]
    if missing:
        looked = "; ".join(f"{f}: {' or '.join(CONFIG_NAMES[f])}" for f in missing)
        raise UnsupportedModelError(f"the model's config ({type(config).__name__}) lacks {missing} (looked for "
                                    f"{looked}); give it those fields, or remove .config to infer them by tracing")
    heads, hidden = values["heads"], values["hidden"]
    return ModelDims(family=str(values["family"] or "custom"), layers=values["layers"], hidden=hidden, heads=heads,
                     kv_heads=values["kv_heads"] or heads, ffn_hidden=values["ffn_hidden"] or 4 * hidden,
                     vocab=values["vocab"], experts=values["experts"] or 0, top_k=values["top_k"] or 0)


def dims_of(model: Any) -> ModelDims:
    """The dimensions from ``model.config``, without tracing (for the CLI)."""
    config = getattr(model, "config", None)
    if config is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no .config to read dimensions from; "
                                    "use frontend.trace(model).dims, which infers them from the traced graph")
    return dims_from_config(config)


def _int(value: sympy.Expr, what: str) -> int:
    if not getattr(value, "is_Integer", False):
        raise UnsupportedModelError(f"cannot infer {what}: it is {value}, not a fixed number; give the model a "
                                    f".config with fields {', '.join(CONFIG_NAMES)}")
    return int(value)


def _upstream(start: str, by_name: Mapping[str, Node]) -> list[Node]:
    """Nodes that ``start`` reads from, nearest first (breadth-first over inputs)."""
    seen, order, frontier = {start}, [], [start]
    while frontier:
        name = frontier.pop(0)
        node = by_name.get(name)
        if node is None:
            continue
        order.append(node)
        for i in node.inputs:
            if i not in seen:
                seen.add(i)
                frontier.append(i)
    return order


def _kv_heads(attn: Node, by_name: Mapping[str, Node], head_dim: int, heads: int) -> int:
    k_input = attn.inputs[1] if len(attn.inputs) > 1 else ""
    proj = next((n for n in _upstream(k_input, by_name) if n.op == OpKind.MATMUL), None)
    return _int(proj.outputs[0].shape[-1], "kv_heads") // head_dim if proj else heads


def _ffn_hidden(block: Block, attn: Node, by_name: Mapping[str, Node], leaf_costs: Mapping[str, LeafCost]) -> int:
    experts = [c.ffn_hidden for c in leaf_costs.values() if c.ffn_hidden]
    if experts:
        return experts[0]
    feeds_attention = {n.name for n in _upstream(attn.name, by_name)}
    widths = [_int(by_name[n].outputs[0].shape[-1], "ffn_hidden") for n in block.nodes
              if by_name[n].op == OpKind.MATMUL and n not in feeds_attention]
    if not widths:
        raise UnsupportedModelError(f"cannot infer ffn_hidden: layer {block.name!r} has no matmul outside its "
                                    f"attention; give the model a .config with fields {', '.join(CONFIG_NAMES)}")
    return max(widths)


def _family(nodes: Sequence[Node], leaf_costs: Mapping[str, LeafCost]) -> str:
    targets = {n.target for n in nodes if n.op == OpKind.NORM}
    if any(c.experts for c in leaf_costs.values()):
        return "moe"
    if any("rms_norm" in t for t in targets):
        return "llama"
    return "gpt" if any("layer_norm" in t for t in targets) else "custom"


def infer_dims(nodes: Sequence[Node], params: Sequence[Param], blocks: Sequence[Block],
               leaf_costs: Mapping[str, LeafCost]) -> ModelDims:
    """The dimensions read off a traced graph (module docstring)."""
    by_name = {n.name: n for n in nodes}
    shapes = {p.name: p.shape for p in params}
    embed = next((n for n in nodes if n.op == OpKind.EMBEDDING and n.params), None)
    attn = next((n for n in nodes if n.op == OpKind.ATTENTION), None)
    lacking = [what for what, found in (("no embedding", embed), ("no attention op", attn),
                                        ("no repeated layers (children of an nn.ModuleList)", blocks)) if not found]
    if lacking:
        raise UnsupportedModelError(f"cannot infer the model's dimensions: the graph has {', '.join(lacking)}; "
                                    f"give the model a .config with fields {', '.join(CONFIG_NAMES)}")
    vocab, hidden = shapes[embed.params[0]][:2]
    q = attn.input_metas[0].shape  # (b, heads, s, head_dim)
    heads, head_dim = _int(q[-3], "heads"), _int(q[-1], "head_dim")
    costs = [c for c in leaf_costs.values() if c.experts]
    return ModelDims(family=_family(nodes, leaf_costs), layers=len(blocks), hidden=hidden, heads=heads,
                     kv_heads=_kv_heads(attn, by_name, head_dim, heads),
                     ffn_hidden=_ffn_hidden(blocks[0], attn, by_name, leaf_costs), vocab=vocab,
                     experts=costs[0].experts if costs else 0, top_k=costs[0].top_k if costs else 0)
