"""Predictions for published runs (bench/data/reference_runs.csv), with the published setup.

Narayanan et al. 2021 count TFLOP/s with the recompute forward (hardware FLOPs, REFERENCE.md sec. 0),
so they compare with ``hardware_tflops_per_gpu``. Nothing in the cost model is fitted to these
rows; the tolerance says how far a first-principles model may be from 2021 Megatron-LM on Selene.
"""
from __future__ import annotations

import pytest

from meshplan.cost_model import Cluster, estimate


def test_gpt3_175b_ptdp_on_1536_a100(make_graph, make_plan, make_gpt) -> None:
    """Narayanan Table 2, PTD-P row: 174.6B, tp 8 x pp 12 x dp 16, batch 1536, micro-batch 1: 141 TF/s."""
    cfg = make_gpt(96, 12288, 96)
    cluster = Cluster.preset("a100-80gb", nodes=192)
    plan = make_plan(cfg, cluster, global_batch=1536, seq_len=2048, tp=8, pp=12, dp=16, recompute="full")
    pred = estimate(make_graph(cfg), cluster, plan)
    assert pred.hardware_tflops_per_gpu == pytest.approx(141, rel=0.25)
    assert pred.peak_memory_bytes < pred.memory_limit_bytes


def test_gpt3_175b_on_1024_a100(make_graph, make_plan, make_gpt) -> None:
    """Narayanan sec. 5.1: GPT-3 on 1024 A100s at 140 TF/s (tp 8, pp 8, dp 16, batch 1536)."""
    cfg = make_gpt(96, 12288, 96)
    cluster = Cluster.preset("a100-80gb", nodes=128)
    plan = make_plan(cfg, cluster, global_batch=1536, seq_len=2048, tp=8, pp=8, dp=16, recompute="full")
    assert estimate(make_graph(cfg), cluster, plan).hardware_tflops_per_gpu == pytest.approx(140, rel=0.25)


@pytest.mark.parametrize("recompute, sp, measured_s", [("full", False, 18.13), ("selective", True, 13.75)])
def test_korthikanti_175b_iteration_time(make_graph, make_plan, make_gpt, recompute, sp, measured_s) -> None:
    """Korthikanti et al. 2022, tables 3 and 5: 175B on 64 A100s, tp 8, pp 8, 3 chunks, batch 64."""
    cfg = make_gpt(96, 12288, 96)
    cluster = Cluster.preset("a100-80gb", nodes=8)
    plan = make_plan(cfg, cluster, global_batch=64, seq_len=2048, tp=8, pp=8, recompute=recompute, sp=sp,
                     schedule="interleaved-1f1b", vp=3)
    assert estimate(make_graph(cfg), cluster, plan).step_time_s == pytest.approx(measured_s, rel=0.25)
