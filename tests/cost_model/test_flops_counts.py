"""FLOP counts against the closed forms of Korthikanti (eq. 7), Narayanan (eq. 3) and PaLM."""
from __future__ import annotations

import pytest

from meshplan import ir
from meshplan.cost_model import hardware_flops_per_step, layer_matmul_params, model_flops_per_step


@pytest.mark.parametrize("h, a, L, B", [(12288, 96, 96, 1536), (6144, 64, 48, 4), (2304, 24, 24, 512)])
def test_gpt_model_flops_is_korthikanti_eq7(h, a, L, B) -> None:
    s, v = 2048, 51200
    dims = ir.ModelDims(family="gpt", layers=L, hidden=h, heads=a, kv_heads=a, ffn_hidden=4 * h, vocab=v)
    eq7 = 72 * B * L * s * h * h * (1 + s / (6 * h) + v / (12 * h * L))
    assert model_flops_per_step(dims, B, s) == pytest.approx(eq7, rel=1e-12)
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + v / (16 * L * h))
    assert hardware_flops_per_step(dims, B, s, ["full"] * L) == pytest.approx(eq3, rel=1e-12)
    selective = hardware_flops_per_step(dims, B, s, ["selective"] * L) - model_flops_per_step(dims, B, s)
    assert selective == pytest.approx(L * 4 * B * s * s * h)


def test_gqa_and_moe_count_what_a_token_multiplies() -> None:
    llama = ir.ModelDims(family="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
                         vocab=128256)
    assert layer_matmul_params(llama) == 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    moe = ir.ModelDims(family="moe", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000,
                       experts=8, top_k=2)
    dense_top2 = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 3 * 4096 * 14336 + 4096 * 8
    assert layer_matmul_params(moe) == dense_top2
    # PaLM: 6N + 12*L*H*Q*T per token, N the non-embedding matmul weights plus the output layer
    tokens, s = 4 * 8192, 8192
    n = 80 * layer_matmul_params(llama) + 128256 * 8192
    palm = tokens * (6 * n + 12 * 80 * 64 * 128 * s)
    assert model_flops_per_step(llama, 4, s) == pytest.approx(palm, rel=1e-12)


@pytest.mark.parametrize("family, extra", [("gpt", {}), ("llama", {}), ("moe", {"experts": 16, "top_k": 4})])
def test_the_timed_matmuls_are_the_counted_ones_when_heads_are_not_hidden_wide(family, extra) -> None:
    # Qwen3-30B-A3B's shape: 32 heads of 128 on a hidden size of 2048, so Q and the attention output are
    # 4096 wide; the matmuls the step time is made of must multiply through the same weights as the FLOP count
    from meshplan.cost_model.layer_cost import LayerShape, layer_matmuls

    dims = ir.ModelDims(family=family, layers=2, hidden=2048, heads=32, kv_heads=4, ffn_hidden=768, vocab=1000,
                     head_dim=128, **extra)
    shape = LayerShape(dims=dims, micro_batch=2, seq_len=512)
    timed = sum(2.0 * m * n * k * count for m, n, k, count in layer_matmuls(shape))
    assert timed == pytest.approx(2.0 * shape.tokens * layer_matmul_params(dims), rel=1e-12)
