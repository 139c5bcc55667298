"""The fusion patterns, as data: what chain of IR ops each fused kernel replaces, and its math.

Each ``Pattern`` is read twice: ``codegen.fusion`` matches its ``steps`` against an ``ir.Graph``,
and ``codegen.kernels`` generates its kernels (from ``expr`` for an elementwise chain, from a
hand-written template for a row-wise one). A step matches one IR node: its aten op among ``ops``;
its inputs besides the previous step's output bound, in order, to ``args``; its parameters bound
to ``params``. An ``epilogue`` step takes only the bias add out of a matmul (``linear`` adds the
bias in the GEMM; fused, the GEMM runs without it and the kernel adds it, as Megatron-LM's
``skip_bias_add`` does).

Memory traffic, per element of the output, counting each full-size tensor read or written once
(bias vectors and broadcast masks are negligible and not counted):

* unfused, forward: each op reads its inputs and writes its output;
* fused, forward: the chain's external inputs are read once and its outputs written once;
* backward (elementwise chains): eager autograd runs one backward kernel per op, which reads the
  incoming gradient and the saved inputs it needs and writes a gradient per input (an add's
  backward passes the gradient through and moves nothing; a bias gradient reads it once to sum);
  the generated backward reads the gradient and the inputs its derivatives use once and writes
  each distinct input gradient once (``kernels.elementwise`` counts it from the derivatives).

The priority of overlapping matches is the order of ``PATTERNS``: longer chains first.
Sources: Megatron-LM's fused bias-GeLU, bias-dropout-add and scale-mask-softmax
(Shoeybi et al. 2019; megatron/core/fusions); Liger-Kernel's SwiGLU and RMSNorm (Hsu et al. 2024);
Triton tutorials 02 (fused softmax) and 05 (layer norm).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import sympy

from .expr import parse

RESERVED = frozenset({"pid", "offs", "in_bounds", "n_elements", "n_cols", "seed", "BLOCK", "dout", "tl", "triton",
                      "torch", "out"})
COMMUTATIVE = frozenset({"add", "mul"})
PASS_THROUGH = frozenset({"add"})  # backward hands the gradient on unchanged: no kernel, no traffic


class Kind(StrEnum):
    ELEMENTWISE = "elementwise"  # kernels generated from ``expr`` and its sympy derivatives
    ROWWISE = "rowwise"  # a reduction along the last dim: kernels from a template


class Broadcast(StrEnum):
    FULL = "full"  # the output's shape
    VECTOR = "vector"  # (last dim,): a bias or a norm weight
    SUFFIX = "suffix"  # the output's trailing dims, repeated over the leading ones (an attention mask)


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    ops: tuple[str, ...]  # aten op names, e.g. ("silu",)
    args: tuple[str, ...] = ()  # names of the node's other inputs (an epilogue's: the matmul's output)
    params: tuple[str, ...] = ()  # names of the node's parameters, in order
    epilogue: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Traffic:
    """Full-size tensors read plus written, per output element, by the rules of the module docstring."""

    unfused: int
    fused: int

    @property
    def saved(self) -> int:
        return self.unfused - self.fused

    def comment(self, what: str) -> str:
        return (f"# memory traffic ({what}), full-size tensors read + written per element: eager {self.unfused}, "
                f"fused {self.fused}; saves {self.saved} ({100 * self.saved // self.unfused}%)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pattern:
    name: str  # stable: ir.Plan.fusions records it
    kind: Kind
    steps: tuple[Step, ...]
    outputs: tuple[tuple[str, int], ...] = (("out", -1),)  # (output, index of the step whose node it replaces)
    expr: str = ""  # ELEMENTWISE: the output in terms of args, scalars and randoms
    broadcast: tuple[tuple[str, Broadcast], ...] = ()  # args not FULL
    scalars: tuple[tuple[str, float], ...] = ()  # kernel scalars and their defaults
    randoms: tuple[tuple[str, str], ...] = ()  # (symbol, scalar p): 1 with probability 1 - p, else 0
    formula: str
    source: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))
        if not self.steps:
            raise ValueError(f"pattern {self.name!r} has no steps")
        bad = sorted(RESERVED & {*self.args, *dict(self.scalars), *dict(self.randoms)})
        if bad:
            raise ValueError(f"pattern {self.name!r} names {bad}, which generated kernels use; rename them")
        if self.kind is Kind.ELEMENTWISE and (not self.expr or len(self.outputs) != 1 or not self.full_args):
            raise ValueError(f"elementwise pattern {self.name!r} needs an expr, exactly one output and a full-size arg")
        unknown = sorted({prob for _, prob in self.randoms} - set(dict(self.scalars)))
        if unknown:
            raise ValueError(f"pattern {self.name!r}: random draws use {unknown}, which are not among its scalars")
        if any(not -len(self.steps) <= i < len(self.steps) for _, i in self.outputs):
            raise ValueError(f"pattern {self.name!r}: an output names a step outside 0..{len(self.steps) - 1}")

    @property
    def args(self) -> tuple[str, ...]:
        """Tensor inputs of the fused op, in the order of its function's arguments."""
        return tuple(dict.fromkeys(a for s in self.steps for a in (*s.args, *s.params)))

    def broadcast_of(self, arg: str) -> Broadcast:
        return dict(self.broadcast).get(arg, Broadcast.FULL)

    @property
    def full_args(self) -> tuple[str, ...]:
        return tuple(a for a in self.args if self.broadcast_of(a) is Broadcast.FULL)

    @property
    def class_name(self) -> str:
        """The generated autograd.Function's name: ``swiglu`` -> ``SwigluFunction``."""
        return "".join(part.title() for part in self.name.split("_")) + "Function"

    @property
    def expression(self) -> sympy.Expr:
        return parse(self.expr)

    def output_steps(self) -> frozenset[int]:
        return frozenset(i % len(self.steps) for _, i in self.outputs)

    def forward_traffic(self) -> Traffic:
        full = set(self.full_args)
        unfused = sum((i > 0) + s.epilogue + sum(a in full for a in s.args if not s.epilogue) + 1
                      for i, s in enumerate(self.steps))
        return Traffic(unfused=unfused, fused=len(full) + len(self.outputs))

    def eager_backward_traffic(self) -> int:
        """Full-size tensors eager autograd reads plus writes per element in the chain's backward."""
        full = set(self.full_args)
        total = 0
        for i, s in enumerate(self.steps):
            ins = (i > 0) + s.epilogue + sum(a in full for a in s.args if not s.epilogue)
            if s.epilogue:
                total += 1  # the bias gradient reads the incoming gradient once
            elif not PASS_THROUGH & set(s.ops):
                total += 1 + 2 * ins  # gradient and saved inputs in, one gradient per input out
        return total


_LINEAR = ("linear", "addmm")
_P = (("p", 0.1),)

PATTERNS: tuple[Pattern, ...] = (
    Pattern(name="bias_dropout_add", kind=Kind.ELEMENTWISE,
            steps=(Step(ops=_LINEAR, args=("x",), params=("bias",), epilogue=True), Step(ops=("dropout",)),
                   Step(ops=("add",), args=("residual",))),
            expr="(x + bias) * keep / (1 - p) + residual", broadcast=(("bias", Broadcast.VECTOR),), scalars=_P,
            randoms=(("keep", "p"),), formula="dropout(x + bias, p) + residual",
            source="Megatron-LM bias_dropout_add_fusion"),
    Pattern(name="softmax", kind=Kind.ROWWISE,
            steps=(Step(ops=("mul", "div"), args=("x",)), Step(ops=("add",), args=("mask",)),
                   Step(ops=("softmax", "_softmax", "_safe_softmax"))),
            broadcast=(("mask", Broadcast.SUFFIX),), scalars=(("scale", 1.0),),
            formula="softmax(scale * x + mask) along the last dim",
            source="Megatron-LM FusedScaleMaskSoftmax; Triton tutorial 02"),
    Pattern(name="bias_gelu", kind=Kind.ELEMENTWISE,
            steps=(Step(ops=_LINEAR, args=("x",), params=("bias",), epilogue=True), Step(ops=("gelu",))),
            expr="gelu_tanh(x + bias)", broadcast=(("bias", Broadcast.VECTOR),),
            formula="gelu(x + bias, approximate='tanh')", source="Megatron-LM fused_bias_gelu"),
    Pattern(name="swiglu", kind=Kind.ELEMENTWISE, steps=(Step(ops=("silu",), args=("a",)), Step(ops=("mul",), args=("b",))),
            expr="silu(a) * b", formula="silu(a) * b", source="Shazeer 2020; Liger-Kernel swiglu"),
    Pattern(name="dropout_add", kind=Kind.ELEMENTWISE,
            steps=(Step(ops=("dropout",), args=("x",)), Step(ops=("add",), args=("residual",))),
            expr="x * keep / (1 - p) + residual", scalars=_P, randoms=(("keep", "p"),),
            formula="dropout(x, p) + residual", source="Megatron-LM bias_dropout_add_fusion, without the bias"),
    Pattern(name="add_rmsnorm", kind=Kind.ROWWISE,
            steps=(Step(ops=("add",), args=("x", "residual")), Step(ops=("rms_norm", "_fused_rms_norm"), params=("weight",))),
            outputs=(("out", 1), ("residual", 0)), broadcast=(("weight", Broadcast.VECTOR),), scalars=(("eps", 1e-6),),
            formula="s = x + residual; (s * rsqrt(mean(s^2) + eps) * weight, s)",
            source="Zhang and Sennrich 2019 (RMSNorm); Liger-Kernel rms_norm"),
    Pattern(name="add_layernorm", kind=Kind.ROWWISE,
            steps=(Step(ops=("add",), args=("x", "residual")),
                   Step(ops=("layer_norm", "native_layer_norm"), params=("weight", "bias"))),
            outputs=(("out", 1), ("residual", 0)),
            broadcast=(("weight", Broadcast.VECTOR), ("bias", Broadcast.VECTOR)), scalars=(("eps", 1e-5),),
            formula="s = x + residual; ((s - mean(s)) * rsqrt(var(s) + eps) * weight + bias, s)",
            source="Ba et al. 2016 (LayerNorm); Triton tutorial 05"),
)

BY_NAME: dict[str, Pattern] = {p.name: p for p in PATTERNS}


def pattern(name: str) -> Pattern:
    if name not in BY_NAME:
        raise KeyError(f"no fusion pattern named {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]
