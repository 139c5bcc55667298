"""The per-op cost table on shapes no zoo model has (cross-attention, batched and biased matmuls)."""
from __future__ import annotations

import sympy
from hypothesis import given
from hypothesis import strategies as st

from meshplan import ir
from meshplan.frontend.op_rules import op_bytes, rule_for

dims = st.integers(min_value=1, max_value=4096)


def _meta(*shape, dtype="float32"):
    return ir.TensorMeta(shape=shape, dtype=dtype)


@given(b=dims, heads=dims, sq=dims, sk=dims, d=dims, dv=dims)
def test_attention_counts_both_products_over_the_full_score_matrix(b, heads, sq, sk, d, dv):
    rule = rule_for("scaled_dot_product_attention")
    q, k, v, out = _meta(b, heads, sq, d), _meta(b, heads, sk, d), _meta(b, heads, sk, dv), _meta(b, heads, sq, dv)
    assert rule.kind == ir.OpKind.ATTENTION
    assert rule.flops((q, k, v), (out,)) == 2 * b * heads * sq * sk * d + 2 * b * heads * sq * sk * dv


@given(batch=dims, m=dims, k=dims, n=dims)
def test_matmul_variants_agree_on_two_flops_per_multiply_add(batch, m, k, n):
    a, w, out = _meta(batch, m, k), _meta(batch, k, n), _meta(batch, m, n)
    assert rule_for("bmm").flops((a, w), (out,)) == 2 * batch * m * k * n
    bias = _meta(n)
    linear = rule_for("linear").flops((_meta(batch, m, k), _meta(n, k), bias), (out,))
    assert linear == 2 * batch * m * k * n + batch * m * n
    addmm = rule_for("addmm").flops((bias, _meta(m, k), _meta(k, n)), (_meta(m, n),))
    assert addmm == 2 * m * k * n + m * n


def test_bytes_modes():
    x, w = _meta(ir.BATCH, ir.SEQ, 64), _meta(64, 64, dtype="bfloat16")
    assert op_bytes(rule_for("linear"), (x, w), (x,)) == 2 * 4 * 64 * ir.BATCH * ir.SEQ + 2 * 64 * 64
    assert op_bytes(rule_for("transpose"), (x,), (x,)) == 0  # an alias moves nothing
    table, ids = _meta(50000, 64), _meta(ir.BATCH, ir.SEQ, dtype="int64")
    gathered = op_bytes(rule_for("embedding"), (table, ids), (x,))
    assert sympy.expand(gathered - (8 + 2 * 4 * 64) * ir.BATCH * ir.SEQ) == 0  # rows, not the table


def test_in_place_ops_cost_like_their_copies_and_unknown_ops_are_other():
    assert rule_for("add_") is rule_for("add") and rule_for("add").kind == ir.OpKind.ELEMENTWISE
    assert rule_for("bincount").kind == ir.OpKind.OTHER
    assert rule_for("rms_norm").kind == ir.OpKind.NORM and rule_for("_softmax").kind == ir.OpKind.SOFTMAX
