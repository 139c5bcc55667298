"""Parameters and FLOPs of a transformer from its dimensions alone.

Notation: B global batch (sequences), s sequence length, L layers, h hidden, a heads, kv key/value
width (kv_heads * head_dim), f FFN width, V vocabulary, E experts, k experts per token (top_k).

Model FLOPs per step (Korthikanti et al. 2022, arXiv:2205.05198, eq. 7, generalized)::

    F_model = 3 * [ L * (2*B*s*P_mm + 4*B*s^2*h) + 2*B*s*h*V ]

* ``P_mm`` is the matmul weights one token goes through in a layer: ``2*h*q + 2*h*kv`` (q = heads *
  head_dim, which is h for most models but not all) for
  attention (grouped-query aware) plus ``2*h*f`` (GELU MLP), ``3*h*f`` (SwiGLU) or
  ``k*3*h*f + h*E`` (MoE: the top-k experts and the router). For GPT with kv = h and f = 4h,
  P_mm = 12h^2 and F_model = 72*B*L*s*h^2*(1 + s/6h + V/12hL), eq. 7 exactly.
* Attention scores and values are ``4*B*s^2*h`` forward. A causal mask is counted as full, as
  Megatron-LM and PaLM (Chowdhery et al. 2022, App. B) do.
* The factor 3 is forward + backward (the backward costs twice the forward).

Hardware FLOPs add what recomputation repeats: a layer under full recompute runs its forward
again (so 4x instead of 3x; Narayanan et al. 2021 eq. 3 is 96*B*s*l*h^2*(1 + s/6h + V/16lh)),
a layer under selective recompute runs its attention core (4*B*s^2*h) again. Korthikanti's eq. 8
adds 3x the core for selective recompute; we count the one forward that actually reruns.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..ir.graph import ModelDims


def kv_width(dims: ModelDims) -> int:
    """Width of K (and of V): kv_heads * head_dim; kv_heads 0 means 'as many as heads'."""
    return (dims.kv_heads or dims.heads) * dims.head_dim


def q_width(dims: ModelDims) -> int:
    """Width of Q (and of attention's output): heads * head_dim, which is not always h (GPT-OSS: 64 heads
    of 64 on a hidden size of 2880; Qwen3: head_dim 128 on any hidden size)."""
    return dims.heads * dims.head_dim


def attention_params(dims: ModelDims) -> int:
    h, q, kv = dims.hidden, q_width(dims), kv_width(dims)
    bias = (q + h + 2 * kv) if dims.family == "gpt" else 0
    return 2 * h * q + 2 * h * kv + bias  # wq (h x q), wo (q x h); wk, wv (h x kv)


def dense_mlp_params(dims: ModelDims) -> int:
    """MLP weights outside the experts: the whole MLP (gpt, llama) or the router (moe)."""
    h, f = dims.hidden, dims.ffn_hidden
    if dims.family == "gpt":
        return 2 * h * f + f + h  # fc1, fc2 with biases
    if dims.family == "moe":
        return h * dims.experts  # router
    return 3 * h * f  # w1, w2, w3


def expert_params(dims: ModelDims) -> int:
    """Weights of all experts of one layer (0 for dense models)."""
    return dims.experts * 3 * dims.hidden * dims.ffn_hidden if dims.family == "moe" else 0


def norm_params(dims: ModelDims) -> int:
    return (4 if dims.family == "gpt" else 2) * dims.hidden


def layer_params(dims: ModelDims) -> int:
    return attention_params(dims) + dense_mlp_params(dims) + expert_params(dims) + norm_params(dims)


def layer_matmul_params(dims: ModelDims) -> int:
    """Matmul weights one token multiplies through in a layer (P_mm): top-k experts for MoE."""
    h, f, kv = dims.hidden, dims.ffn_hidden, kv_width(dims)
    attn = 2 * h * q_width(dims) + 2 * h * kv
    if dims.family == "gpt":
        return attn + 2 * h * f
    if dims.family == "moe":
        return attn + dims.top_k * 3 * h * f + h * dims.experts
    return attn + 3 * h * f


def layer_forward_flops(dims: ModelDims, sequences: float, seq_len: int) -> float:
    """Forward FLOPs of one layer over ``sequences`` sequences: matmuls plus the attention core."""
    tokens = sequences * seq_len
    return 2.0 * tokens * layer_matmul_params(dims) * dims.matmul_scale + attention_core_flops(dims, sequences, seq_len)


def attention_core_flops(dims: ModelDims, sequences: float, seq_len: int) -> float:
    """Q K^T and P V forward, counting a causal mask as full: 4 * b * s^2 * heads * head_dim (= h mostly)."""
    return 4.0 * sequences * seq_len * seq_len * q_width(dims) * dims.core_scale


def window_share(dims: ModelDims, seq_len: float) -> float:
    """The mean share of a layer's causal attention work a fused kernel executes when ``dims.windowed_layers`` of its
    layers attend ``dims.attention_window`` positions back: such a layer's query i reads min(i, w) keys, s w - w^2 / 2
    pairs in all against the s^2 / 2 of a full causal mask, so 2 w / s - (w / s)^2 of them; 1 where the window spans
    the sequence. The attention core's time scales by it; its FLOP count (``attention_core_flops``, what the traced
    graph is checked against) does not."""
    part = windowed_part(dims, seq_len)
    return 1.0 - part + part * window_pair_share(dims.attention_window, seq_len) if part else 1.0


def windowed_part(dims: ModelDims, seq_len: float) -> float:
    """The share of the layers whose attention a window narrows at ``seq_len`` (0 where none does)."""
    if not dims.attention_window or not dims.windowed_layers or not dims.layers or dims.attention_window >= seq_len:
        return 0.0
    return min(dims.windowed_layers, dims.layers) / dims.layers


def window_pair_share(window: float, seq_len: float) -> float:
    """A windowed layer's (query, key) pairs over a causal layer's: 2 w / s - (w / s)^2."""
    return 2.0 * window / seq_len - (window / seq_len) ** 2


def logits_forward_flops(dims: ModelDims, sequences: float, seq_len: int) -> float:
    return 2.0 * sequences * seq_len * dims.hidden * dims.vocab


def model_flops_per_step(dims: ModelDims, global_batch: int, seq_len: int) -> float:
    """Korthikanti eq. 7 generalized (see the module docstring); no recomputation counted."""
    per_layer = layer_forward_flops(dims, global_batch, seq_len)
    return 3.0 * (dims.layers * per_layer + logits_forward_flops(dims, global_batch, seq_len))


def recompute_flops_per_step(dims: ModelDims, global_batch: int, seq_len: int,
                             recompute: Iterable[str]) -> float:
    """FLOPs that recomputation adds: a forward per full layer, an attention core per selective one."""
    full = selective = 0
    for r in recompute:
        full += r == "full"
        selective += r == "selective"
    return (full * layer_forward_flops(dims, global_batch, seq_len)
            + selective * attention_core_flops(dims, global_batch, seq_len))


def hardware_flops_per_step(dims: ModelDims, global_batch: int, seq_len: int, recompute: Iterable[str]) -> float:
    return model_flops_per_step(dims, global_batch, seq_len) + recompute_flops_per_step(
        dims, global_batch, seq_len, recompute)
