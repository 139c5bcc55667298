"""Model-state memory under ZeRO: the paper's known answers, and the estimate's use of them."""
from __future__ import annotations

import pytest

from meshplan.cost_model import Cluster, estimate, memory_breakdown, state_bytes

GB = 1e9


@pytest.mark.parametrize("stage, expect_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_table_psi_7_5b_on_64_gpus(stage: int, expect_gb: float) -> None:
    """Rajbhandari et al. 2020, Fig. 1 / Table 1: Psi = 7.5B, N_d = 64, K = 12."""
    total = sum(state_bytes(7.5e9, dp=64, zero_stage=stage, dtype="bfloat16").values())
    assert total / GB == pytest.approx(expect_gb, abs=0.1)


def test_sixteen_bytes_per_parameter_in_both_dtypes() -> None:
    mixed = state_bytes(1e9, dp=1, zero_stage=0, dtype="bfloat16")
    fp32 = state_bytes(1e9, dp=1, zero_stage=0, dtype="float32")
    assert mixed == {"params": 2e9, "grads": 2e9, "optimizer": 12e9}
    assert fp32 == {"params": 4e9, "grads": 4e9, "optimizer": 8e9}


def test_estimate_shards_states_over_dp_and_tp(make_graph, make_plan) -> None:
    from meshplan import zoo
    cfg = zoo.config("llama3-8b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm")
    psi = zoo.param_count(cfg)
    dp0 = memory_breakdown(graph, cluster, make_plan(cfg, cluster, global_batch=8, seq_len=1024, dp=8))
    assert dp0["params"] == pytest.approx(2 * psi) and dp0["optimizer"] == pytest.approx(12 * psi)
    z3 = memory_breakdown(graph, cluster, make_plan(cfg, cluster, global_batch=8, seq_len=1024, dp=8, zero=3))
    assert z3["params"] == pytest.approx(2 * psi / 8) and z3["grads"] == pytest.approx(2 * psi / 8)
    tp8 = memory_breakdown(graph, cluster, make_plan(cfg, cluster, global_batch=8, seq_len=1024, tp=8))
    assert psi * 2 / 8 < tp8["params"] < psi * 2 / 8 * 1.01  # norms stay whole under TP
    pred = estimate(graph, cluster, make_plan(cfg, cluster, global_batch=8, seq_len=1024, dp=8, zero=3))
    assert pred.memory_bytes == z3 and pred.peak_memory_bytes == pytest.approx(sum(z3.values()))
