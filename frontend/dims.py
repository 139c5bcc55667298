"""The model's transformer dimensions (``ir.ModelDims``): from its config, else from its graph.

From a config (``model.config``), by field name: the zoo's ``ModelConfig`` names first, then the
usual Hugging Face names (``CONFIG_NAMES``); ``head_dim`` is the config's own when it has one (it
is not always hidden / heads: GPT-OSS has hidden 2880 and 64 heads of 64). From a traced graph,
when there is no config, or ``trace`` finds one without the required names (``has_config_dims``):

    vocab, hidden   the embedding table's (rows, columns); without an embedding, the width of the
                    model's first input
    layers          the number of repeated layers (blocks)
    heads, head_dim q of the first attention node, (b, heads, s, head_dim); 0 without attention
    kv_heads        width of the matmul that makes attention's k, / head_dim; when one matmul makes
                    q, k and v (nanoGPT's c_attn, width (heads + 2 kv_heads) * head_dim), what is
                    left of it after q's heads, halved
    ffn_hidden      a MoE leaf's expert width, else the widest matmul of the first layer that does
                    not feed its attention
    family          "moe" with a MoE leaf, "llama" with rms_norm, "gpt" with layer_norm, else "custom"

The cost model knows the families "gpt", "llama" and "moe"; a Hugging Face ``model_type`` ("mixtral",
"qwen3", "gpt2") is mapped to one of them (``normalized_family``): "moe" with experts, else "llama"
for a gated MLP (two input projections, or a SiLU config), "gpt" for one.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import sympy

from ..ir import Block, ModelDims, ModelStructure, Node, OpKind, Param, UnsupportedModelError
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
    "top_k": ("top_k", "num_experts_per_tok", "top_k_experts"),
}
_REQUIRED = ("layers", "hidden", "heads", "vocab")
FAMILIES = ("gpt", "llama", "moe")


def _lookup(config: Any, names: Sequence[str]) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else _attribute(config, name)
        if value is not None:
            return value
    return None


def _attribute(config: Any, name: str) -> Any:
    """``config.name``; for a field a heterogeneous Hugging Face config sets layer by layer (Gemma 4's
    ``head_dim``: 256 on its sliding-window layers, 512 on its full ones; transformers raises on the global read,
    ``AmbiguousGlobalPerLayerAttributeError``), the mean over its layers (``per_layer_config``), rounded: the
    projections' widths, parameters and FLOPs are linear in it, so their totals over the layers stay right."""
    if name in (getattr(config, "per_layer_attributes", None) or ()):
        values = [getattr(layer, name, None) for layer in config.per_layer_config]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return round(sum(values) / len(values))
        return None
    return getattr(config, name, None)


def has_config_dims(config: Any) -> bool:
    """The config names every required dimension (``_REQUIRED``) with an integer."""
    return all(isinstance(_lookup(config, CONFIG_NAMES[f]), int) for f in _REQUIRED)


def dims_from_config(config: Any) -> ModelDims:
    values = {f: _lookup(config, names) for f, names in CONFIG_NAMES.items()}
    missing = [f for f in _REQUIRED if not isinstance(values[f], int)]
    if missing:
        looked = "; ".join(f"{f}: {' or '.join(CONFIG_NAMES[f])}" for f in missing)
        raise UnsupportedModelError(f"the model's config ({type(config).__name__}) lacks {missing} (looked for "
                                    f"{looked}); give it those fields, or remove .config to infer them by tracing")
    heads, hidden = values["heads"], values["hidden"]
    if values["experts"]:  # Qwen-MoE: the experts' width has its own name
        values["ffn_hidden"] = _lookup(config, ("moe_intermediate_size",)) or values["ffn_hidden"]
    head_dim = _lookup(config, ("head_dim",))
    window, windowed = _sliding_window(config)
    return ModelDims(family=_config_family(config, values), layers=values["layers"], hidden=hidden, heads=heads,
                     kv_heads=values["kv_heads"] or heads, ffn_hidden=values["ffn_hidden"] or 4 * hidden,
                     vocab=values["vocab"], experts=values["experts"] or 0, top_k=values["top_k"] or 0,
                     head_dim=head_dim if isinstance(head_dim, int) and head_dim > 0 else 0,
                     attention_window=window, windowed_layers=windowed, glu_limit=_glu_limit(config))


def _glu_limit(config: Any) -> float:
    """The limit a gated MLP clamps its two halves to (Hugging Face GPT-OSS ``swiglu_limit``), 0.0 for none."""
    limit = _lookup(config, ("swiglu_limit",))
    return float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit > 0 else 0.0


def _sliding_window(config: Any) -> tuple[int, int]:
    """(window, layers that use it) where the config names its layers' kinds: Hugging Face's ``layer_types``, one
    "sliding_attention" or "full_attention" a layer (GPT-OSS, Gemma 2 and 3), with ``sliding_window`` their width.
    (0, 0) otherwise: a bare ``sliding_window`` is not taken, since some families carry one they do not apply
    (Qwen2's ``use_sliding_window`` defaults to False)."""
    window, kinds = _lookup(config, ("sliding_window",)), _lookup(config, ("layer_types",))
    if not isinstance(window, int) or window <= 0 or not isinstance(kinds, (list, tuple)):
        return 0, 0
    windowed = sum(1 for kind in kinds if kind == "sliding_attention")
    return (window, windowed) if windowed else (0, 0)


def _config_family(config: Any, values: Mapping[str, Any]) -> str:
    family = str(values["family"] or "custom")
    if family in FAMILIES or _lookup(config, ("family",)) is not None or family == "custom":
        return family  # the config's own family is kept; a Hugging Face model_type is mapped
    if values["experts"]:
        return "moe"
    act = str(_lookup(config, ("hidden_act", "activation_function", "hidden_activation")) or "")
    return "gpt" if act.startswith("gelu") else "llama"


def normalized_family(dims: ModelDims, structure: ModelStructure) -> ModelDims:
    """A family the cost model knows, from the structure when the config or graph left "custom"."""
    if dims.family in FAMILIES:
        return dims
    family = ("moe" if structure.experts else "llama" if len(structure.mlp_in) == 2
              else "gpt" if len(structure.mlp_in) == 1 and structure.attn else dims.family)
    return dataclasses.replace(dims, family=family)


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


def _projection(attn: Node, index: int, by_name: Mapping[str, Node]) -> Node | None:
    """The nearest matmul upstream of attention's input ``index`` (0: q, 1: k, 2: v)."""
    start = attn.inputs[index] if len(attn.inputs) > index else ""
    return next((n for n in _upstream(start, by_name) if n.op == OpKind.MATMUL), None)


def _kv_heads(attn: Node, by_name: Mapping[str, Node], head_dim: int, heads: int) -> int:
    q_proj, k_proj = _projection(attn, 0, by_name), _projection(attn, 1, by_name)
    if k_proj is None:
        return heads
    width = _int(k_proj.outputs[0].shape[-1], "kv_heads") // head_dim
    if k_proj is q_proj:  # one fused matmul makes q, k and v: width = heads + 2 * kv_heads
        return (width - heads) // 2
    return width


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
    if attn is None or embed is None or not blocks:
        return _plain_dims(nodes, shapes, blocks, embed)
    vocab, hidden = shapes[embed.params[0]][:2]
    q = attn.input_metas[0].shape  # (b, heads, s, head_dim)
    heads, head_dim = _int(q[-3], "heads"), _int(q[-1], "head_dim")
    costs = [c for c in leaf_costs.values() if c.experts]
    return ModelDims(family=_family(nodes, leaf_costs), layers=len(blocks), hidden=hidden, heads=heads,
                     kv_heads=_kv_heads(attn, by_name, head_dim, heads),
                     ffn_hidden=_ffn_hidden(blocks[0], attn, by_name, leaf_costs), vocab=vocab,
                     experts=costs[0].experts if costs else 0, top_k=costs[0].top_k if costs else 0,
                     head_dim=head_dim)


def _plain_dims(nodes: Sequence[Node], shapes: Mapping[str, tuple[int, ...]], blocks: Sequence[Block],
                embed: Node | None) -> ModelDims:
    """A model without attention or token embedding (an MLP stack on float inputs): no heads (0), hidden
    the embedding's width or the first input's last dim, ffn_hidden the widest matmul."""
    if embed is not None:
        vocab, hidden = shapes[embed.params[0]][:2]
    else:
        first = next((n for n in nodes if n.target == "input"), None)
        last = first.outputs[0].shape[-1] if first is not None and first.outputs[0].shape else 0
        vocab, hidden = 0, int(last) if getattr(last, "is_Integer", False) else 0
    widths = [int(n.outputs[0].shape[-1]) for n in nodes if n.op == OpKind.MATMUL and n.params
              and getattr(n.outputs[0].shape[-1], "is_Integer", False)]
    return ModelDims(family="custom", layers=len(blocks), hidden=hidden, heads=0, kv_heads=0,
                     ffn_hidden=max(widths, default=0), vocab=vocab)
