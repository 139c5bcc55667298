"""What each aten op is (an ``ir.OpKind``) and what it costs in the forward pass, as data.

FLOPs count a multiply-add as 2 and follow the usual MFU accounting (Kaplan et al. 2020, sec 2.1;
Chowdhery et al. 2022, app. B):

    matmul      (..., m, k) @ (k, n)               2 * (...) * m * k * n      (+ m * n for a bias); a
                grouped matmul (m, k) rows, each times its expert's (k, n), the same 2 * m * k * n
    attention   q (b, H, sq, d), k/v (b, H, sk, d) 2 * b*H*sq*sk*d  (q k^T) + 2 * b*H*sq*sk*d_v  (p v)
                                                   = 4 * b * H * s^2 * d; the full s^2 is counted for
                                                   causal attention too, as MFU figures (PaLM's 12*L*H*Q*T
                                                   per token, forward + backward) do
    elementwise FLOPS_PER_ELEMENT[op] per output element (1 unless listed; casts 0)
    norm        5 (layer norm) or 4 (rms norm) per element; softmax 5 per element
    reduction   one per input element

Bytes are a first-order memory-traffic estimate: every tensor read (activations, parameters,
buffers) plus every tensor written. Pure views alias their input and move nothing (0 bytes); an
embedding reads the rows it gathers, not its whole table (indices + 2 * output).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from ..ir import OpKind, TensorMeta

Flops = Callable[[tuple[TensorMeta, ...], tuple[TensorMeta, ...]], sympy.Expr]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpRule:
    kind: OpKind
    flops: Flops
    bytes: str = "all"  # "all": inputs + outputs; "none": an alias; "gather": indices + 2 * output


def _zero(ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...]) -> sympy.Expr:
    return sympy.Integer(0)


def _per_out(factor: int) -> Flops:
    return lambda ins, outs: factor * outs[0].numel if outs else sympy.Integer(0)


def _per_in(ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...]) -> sympy.Expr:
    return ins[0].numel if ins else sympy.Integer(0)


def _matmul(a: int, bias: int | None) -> Flops:
    """ins[a] is the left operand (..., m, k); the output is (..., m, n); ins[bias] is added."""
    def flops(ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...]) -> sympy.Expr:
        k = ins[a].shape[-1]
        out = 2 * outs[0].numel * k
        return out + outs[0].numel if bias is not None and len(ins) > bias else out
    return flops


def _attention(ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...]) -> sympy.Expr:
    q, k, v = ins[:3]  # (b, H, sq, d), (b, Hk, sk, d), (b, Hk, sk, dv)
    rows = sympy.Mul(*q.shape[:-1])  # b * H * sq
    return 2 * rows * k.shape[-2] * (q.shape[-1] + v.shape[-1])


def _rules(kind: OpKind, flops: Flops, names: str, bytes_: str = "all") -> dict[str, OpRule]:
    rule = OpRule(kind=kind, flops=flops, bytes=bytes_)
    return {name: rule for name in names.split()}


_ELEMENTWISE = """add sub rsub mul div neg abs exp exp2 log log1p sqrt rsqrt pow reciprocal tanh sigmoid
    gelu silu relu leaky_relu elu softplus hardtanh hardswish hardsigmoid mish erf sin cos where masked_fill
    clamp clamp_min clamp_max maximum minimum dropout native_dropout bernoulli fill lerp addcmul addcdiv
    eq ne lt le gt ge logical_and logical_or logical_not bitwise_and bitwise_or tril triu sign floor ceil
    round trunc"""
_CASTS = "to _to_copy type_as float half bfloat16 copy lift_fresh_copy"
_ALIASES = """view _unsafe_view reshape transpose t permute expand expand_as slice select unsqueeze squeeze
    flatten unflatten narrow split split_with_sizes chunk unbind as_strided alias detach view_as getitem
    _reshape_alias movedim swapaxes numpy_T"""
_COPIES = """cat stack repeat_interleave repeat clone contiguous index_select gather roll flip
    constant_pad_nd pad tile"""
_REDUCTIONS = "sum mean amax amin max min var std var_mean prod linalg_vector_norm norm logsumexp cumsum"

RULES: dict[str, OpRule] = {
    **_rules(OpKind.MATMUL, _matmul(0, None), "mm bmm matmul _grouped_mm grouped_mm grouped_mm_fallback"),
    **_rules(OpKind.MATMUL, _matmul(0, 2), "linear"),
    **_rules(OpKind.MATMUL, _matmul(1, 0), "addmm baddbmm"),
    **_rules(OpKind.ATTENTION, _attention, """scaled_dot_product_attention _scaled_dot_product_flash_attention
        _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention
        _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_fused_attention_overrideable"""),
    **_rules(OpKind.ELEMENTWISE, _per_out(1), _ELEMENTWISE),
    **_rules(OpKind.ELEMENTWISE, _zero, _CASTS),
    **_rules(OpKind.NORM, _per_out(5), "layer_norm native_layer_norm group_norm native_group_norm batch_norm"),
    **_rules(OpKind.NORM, _per_out(4), "rms_norm _fused_rms_norm"),
    **_rules(OpKind.SOFTMAX, _per_out(5), "softmax _softmax log_softmax _log_softmax _safe_softmax"),
    **_rules(OpKind.CROSS_ENTROPY, _per_in, "cross_entropy_loss nll_loss nll_loss_forward nll_loss_nd"),
    **_rules(OpKind.EMBEDDING, _zero, "embedding", "gather"),
    **_rules(OpKind.VIEW, _zero, _ALIASES, "none"),
    **_rules(OpKind.VIEW, _zero, _COPIES),
    **_rules(OpKind.REDUCTION, _per_in, _REDUCTIONS),
}
OTHER = OpRule(kind=OpKind.OTHER, flops=_zero)
# ops outside aten that are known matmuls: Hugging Face's grouped expert matmul on CPU and meta
# (transformers::grouped_mm_fallback, (m, k) rows each times its expert's (k, n) -> (m, n))
FOREIGN_MATMULS = frozenset({"grouped_mm_fallback"})


def rule_for(op_name: str) -> OpRule:
    """The rule of an aten op by its name (``linear``, ``add_``: in-place ops cost what their copies do)."""
    return RULES.get(op_name) or RULES.get(op_name.rstrip("_")) or OTHER


def op_bytes(rule: OpRule, ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...]) -> sympy.Expr:
    """Bytes read and written, by the rule's bytes mode (see the module docstring)."""
    if rule.bytes == "none":
        return sympy.Integer(0)
    written = sympy.Add(*(o.nbytes for o in outs))
    if rule.bytes == "gather":  # embedding(weight, indices): read indices and rows, write rows
        return sympy.Add(*(i.nbytes for i in ins[1:])) + 2 * written
    return sympy.Add(*(i.nbytes for i in ins)) + written
