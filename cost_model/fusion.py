"""Memory traffic of the fused kernels a plan records (``plan.fusions``), in one layer on one GPU.

``layer_cost.elementwise_fwd`` counts the eager memory-bound ops of a layer in full-size tensors
(the stream ``(m, h)``, the FFN activation ``(m, f/tp)``) and kernels; its backward is twice the
forward. A fused kernel replaces some of those ops. Per pattern, as data: how many instances one
layer runs, which tensor size they move, what ``elementwise_fwd`` counts for the chain's eager ops
(and so removes), and what the fused kernel moves instead, forward and backward, read + written per
element (``codegen.kernels``: ``Pattern.forward_traffic().fused`` and the backward kernels' traffic
comments; a test holds the two tables together, since the cost model may import only ``ir``):

    pattern        family       per layer  tensor  eager fwd (kernels)       fused fwd  fused bwd (kernels)
    add_rmsnorm    llama, moe   1          stream  add 3 + RMSNorm ~4 (1+4)   4 (1)      4 (2: rows, dw)
    add_layernorm  gpt          1          stream  add 3 + LayerNorm 2 (1+1)  4 (1)      4 (3: rows, dw, db)
    swiglu         llama        1          ffn     silu 2 + product 3 (2)     3 (1)      5 (1)
    bias_gelu      gpt          1          ffn     GELU 2 (1)                 2 (1)      4 (2: grad, bias sum)

One add + norm per layer: the one inside a block (``codegen.fused``; the MLP's residual add and the
next block's norm cross the block boundary and stay eager). A family is the kind of block the layer
cost prices, the zoo's or a user's: a Hugging Face Llama, Mistral or Qwen3 block is "llama", and its
plan records swiglu alone (the kernel runs on the user's own MLP; the add + norm kernels on the zoo's
blocks only), so these rows hold for it as they are. bias_gelu saves nothing here: PyTorch's
``Linear`` adds its bias in the GEMM's epilogue (cuBLASLt), so the eager GELU already reads and
writes the FFN activation once each; the fused kernel's saving is against Megatron-LM's separate
bias add (``codegen.fusion`` counts that one). Bias and norm-weight vectors are negligible.

A fusion the plan's program cannot run saves nothing: add + norm under sequence parallelism (the
norms run on DTensors), bias_gelu under tensor parallelism (``codegen.fused.blocked`` says why).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .memory import ACTIVATION_BYTES

if TYPE_CHECKING:
    from .layer_cost import LayerShape


@dataclass(frozen=True, slots=True, kw_only=True)
class FusedTraffic:
    families: tuple[str, ...]
    tensor: str  # "stream" (m, h) or "ffn" (m, f/tp)
    per_layer: int
    eager_fwd: int  # full-size tensors read + written per element, as elementwise_fwd counts them
    eager_kernels: int
    fused_fwd: int
    fused_bwd: int
    fused_bwd_kernels: int
    blocked_by_sp: bool = False
    blocked_by_tp: bool = False


FUSED_TRAFFIC: dict[str, FusedTraffic] = {
    "add_rmsnorm": FusedTraffic(families=("llama", "moe"), tensor="stream", per_layer=1, eager_fwd=7, eager_kernels=5,
                                fused_fwd=4, fused_bwd=4, fused_bwd_kernels=2, blocked_by_sp=True),
    "add_layernorm": FusedTraffic(families=("gpt",), tensor="stream", per_layer=1, eager_fwd=5, eager_kernels=2,
                                  fused_fwd=4, fused_bwd=4, fused_bwd_kernels=3, blocked_by_sp=True),
    "swiglu": FusedTraffic(families=("llama",), tensor="ffn", per_layer=1, eager_fwd=5, eager_kernels=2,
                           fused_fwd=3, fused_bwd=5, fused_bwd_kernels=1),
    "bias_gelu": FusedTraffic(families=("gpt",), tensor="ffn", per_layer=1, eager_fwd=2, eager_kernels=1,
                              fused_fwd=2, fused_bwd=4, fused_bwd_kernels=2, blocked_by_tp=True),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class FusionSaving:
    """Bytes and kernels one layer's memory-bound ops save, forward and backward, on one GPU."""

    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0
    fwd_kernels: int = 0
    bwd_kernels: int = 0


def runs(name: str, family: str, *, tp: int, sp: bool) -> bool:
    """Whether the program of a plan (``family``, ``tp``, ``sp``) runs fusion ``name`` in its layers."""
    t = FUSED_TRAFFIC.get(name)
    return (t is not None and family in t.families and not (t.blocked_by_sp and sp)
            and not (t.blocked_by_tp and tp > 1))


def fusion_saving(shape: "LayerShape", fusions: tuple[str, ...]) -> FusionSaving:
    """What the fused kernels of ``fusions`` save in one layer against ``elementwise_fwd``'s eager ops
    (the eager backward is twice the forward there)."""
    d, m, ab = shape.dims, shape.tokens, ACTIVATION_BYTES[shape.dtype]
    size = {"stream": m * d.hidden * ab / (shape.tp if shape.sp else 1), "ffn": m * d.ffn_hidden * ab / shape.tp}
    fwd = bwd = 0.0
    fwd_k = bwd_k = 0
    for name in dict.fromkeys(fusions):
        if not runs(name, d.family, tp=shape.tp, sp=shape.sp):
            continue
        t = FUSED_TRAFFIC[name]
        fwd += t.per_layer * (t.eager_fwd - t.fused_fwd) * size[t.tensor]
        bwd += t.per_layer * (2 * t.eager_fwd - t.fused_bwd) * size[t.tensor]
        fwd_k += t.per_layer * (t.eager_kernels - 1)
        bwd_k += t.per_layer * (2 * t.eager_kernels - t.fused_bwd_kernels)
    return FusionSaving(fwd_bytes=fwd, bwd_bytes=bwd, fwd_kernels=fwd_k, bwd_kernels=bwd_k)


def worthwhile(fusions: tuple[str, ...], family: str, *, tp: int, sp: bool) -> tuple[str, ...]:
    """The fusions of ``fusions`` whose kernels save memory traffic or kernels (time) in the program of a
    plan (``family``, ``tp``, ``sp``), in order: those that move no more bytes and launch no more kernels,
    forward plus backward, and save some of either (at any size, as ``codegen.fusion`` keeps a chain)."""
    def saves(t: FusedTraffic) -> bool:
        moved = 3 * t.eager_fwd - t.fused_fwd - t.fused_bwd  # eager backward: twice the forward
        launched = 3 * t.eager_kernels - 1 - t.fused_bwd_kernels
        return moved >= 0 and launched >= 0 and moved + launched > 0
    return tuple(f for f in dict.fromkeys(fusions) if runs(f, family, tp=tp, sp=sp) and saves(FUSED_TRAFFIC[f]))
