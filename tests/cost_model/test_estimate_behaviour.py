"""estimate(): known answers, the breakdowns it reports, and the errors it raises."""
from __future__ import annotations

import dataclasses
import gc

import pytest

from meshplan import ir, zoo
from meshplan.cost_model import Cluster, bubble_s, collective_time, estimate, summary_of
from meshplan.cost_model import summary as summary_module
from meshplan.cost_model.software import Software

H100 = Cluster.preset("h100-sxm")


def test_small_gpt_prefers_data_parallel_over_tensor_parallel(make_graph, make_plan) -> None:
    cfg = zoo.config("gpt3-1.3b")
    graph = make_graph(cfg)
    dp = estimate(graph, H100, make_plan(cfg, H100, global_batch=64, seq_len=2048, dp=8))
    tp = estimate(graph, H100, make_plan(cfg, H100, global_batch=64, seq_len=2048, tp=8))
    assert dp.step_time_s < tp.step_time_s
    assert dp.time_s["exposed_comm"] < tp.time_s["exposed_comm"]
    assert dp.comm_bytes["tp"] == 0 and tp.comm_bytes["dp"] == 0


def test_70b_llama_does_not_fit_plain_data_parallel_and_sharding_helps(make_graph, make_plan) -> None:
    cfg = zoo.config("llama3-70b")
    graph = make_graph(cfg)
    plain = estimate(graph, H100, make_plan(cfg, H100, global_batch=8, seq_len=4096, dp=8))
    assert plain.peak_memory_bytes > plain.memory_limit_bytes
    assert plain.memory_bytes["params"] + plain.memory_bytes["grads"] + plain.memory_bytes["optimizer"] > 16 * 70e9
    for kw in (dict(dp=8, zero=3), dict(tp=8)):
        sharded = estimate(graph, H100, make_plan(cfg, H100, global_batch=8, seq_len=4096, **kw))
        assert sharded.peak_memory_bytes < plain.peak_memory_bytes / 2
        assert sharded.memory_bytes["optimizer"] == pytest.approx(plain.memory_bytes["optimizer"] / 8, rel=0.01)


def test_breakdowns_add_up(make_graph, make_plan, make_gpt) -> None:
    cfg = make_gpt(24, 2048, 16)
    cluster = Cluster.preset("h100-sxm", nodes=2)
    plan = make_plan(cfg, cluster, global_batch=64, seq_len=2048, tp=2, pp=2, dp=4, micro_batch=2, zero=1,
                     recompute="selective", sp=True)
    pred = estimate(make_graph(cfg), cluster, plan)
    # unpriced: the preset's calibration (estimate.calibrated)
    assert set(pred.time_s) == {"compute", "exposed_comm", "bubble", "unpriced"}
    assert sum(pred.time_s.values()) == pytest.approx(pred.step_time_s)
    assert set(pred.memory_bytes) == {"params", "grads", "optimizer", "activations", "buffers"}
    assert sum(pred.memory_bytes.values()) == pytest.approx(pred.peak_memory_bytes)
    assert pred.tokens_per_s == pytest.approx(64 * 2048 / pred.step_time_s)
    assert pred.memory_limit_bytes == cluster.accelerator.usable_memory_bytes
    assert set(pred.comm_bytes) == {"tp", "cp", "ep", "pp", "dp"} and min(pred.comm_bytes.values()) >= 0
    assert pred.hardware_tflops_per_gpu > pred.model_tflops_per_gpu  # selective recompute reruns attention
    assert pred.mfu == pytest.approx(pred.model_tflops_per_gpu * 1e12 / 989.4e12)


def test_data_parallel_traffic_is_2psi_and_zero3_is_3psi(make_graph, make_plan) -> None:
    cfg = zoo.config("llama3-8b")
    graph, psi = make_graph(cfg), zoo.param_count(cfg)
    bf16 = Software(name="bf16-reduce")  # a program that reduces the bf16 gradients as they are
    ddp = estimate(graph, H100, make_plan(cfg, H100, global_batch=8, seq_len=1024, dp=8), software=bf16)
    assert ddp.comm_bytes["dp"] == pytest.approx(2 * psi * 2 * 7 / 8)  # all-reduce of bf16 grads
    z3 = estimate(graph, H100, make_plan(cfg, H100, global_batch=8, seq_len=1024, dp=8, zero=3), software=bf16)
    assert z3.comm_bytes["dp"] == pytest.approx(1.5 * ddp.comm_bytes["dp"])
    # meshplan's runtime reduces in fp32 (codegen.precision.REDUCE_DTYPE): its gathers stay bf16
    ours = estimate(graph, H100, make_plan(cfg, H100, global_batch=8, seq_len=1024, dp=8, zero=3))
    assert ours.comm_bytes["dp"] == pytest.approx((2 + 2 + 4) * psi * 7 / 8)


def test_bubble_of_uneven_stages_is_the_other_ranks_times() -> None:
    # step = (m - 1) t_k + sum_r t_r for the slowest rank k: the bubble is sum_{r != k} t_r
    assert bubble_s("1f1b", 1, [1.0, 1.0, 1.0, 2.0]) == pytest.approx(3.0)
    assert bubble_s("gpipe", 1, [2.0, 1.0, 1.0, 1.0]) == pytest.approx(3.0)
    assert bubble_s("interleaved-1f1b", 2, [1.0, 1.0, 1.0, 2.0]) == pytest.approx(1.5)
    assert bubble_s("zero-bubble", 1, [1.0, 1.0, 1.0, 2.0]) == pytest.approx(1.0)
    assert bubble_s("1f1b", 1, [0.5] * 8) == pytest.approx(7 * 0.5)  # even stages: (p - 1) t (Narayanan 2021)
    assert bubble_s("1f1b", 1, [3.0]) == 0.0


def test_pipeline_bubble_per_schedule(make_graph, make_plan, make_gpt) -> None:
    cfg = make_gpt(32, 4096, 32)
    cluster = Cluster.preset("h100-sxm", nodes=1)
    graph = make_graph(cfg)
    kw = dict(global_batch=32, seq_len=2048, pp=8)
    one = estimate(graph, cluster, make_plan(cfg, cluster, **kw))
    inter = estimate(graph, cluster, make_plan(cfg, cluster, schedule="interleaved-1f1b", vp=2, **kw))
    zb = estimate(graph, cluster, make_plan(cfg, cluster, schedule="zero-bubble", **kw))
    gpipe = estimate(graph, cluster, make_plan(cfg, cluster, schedule="gpipe", **kw))
    assert inter.time_s["bubble"] == pytest.approx(one.time_s["bubble"] / 2, rel=0.05)
    assert zb.time_s["bubble"] == pytest.approx(one.time_s["bubble"] / 3)
    assert gpipe.time_s["bubble"] == pytest.approx(one.time_s["bubble"])
    # (p - 1)/m of the ideal time with even ranks; here the last rank's output layer sets the pace and the
    # bubble is the other ranks' 7 lighter micro-batch times: less than 7/32 of m times the slowest
    ratio = one.time_s["bubble"] / (one.time_s["compute"] + one.time_s["exposed_comm"])
    assert 7 / 32 / 1.5 < ratio < 7 / 32
    assert gpipe.memory_bytes["activations"] > one.memory_bytes["activations"]  # all m in flight vs p
    assert inter.comm_bytes["pp"] == pytest.approx(2 * one.comm_bytes["pp"])


def test_mixture_of_experts_with_expert_and_context_parallelism(make_graph, make_plan) -> None:
    cfg = zoo.config("mixtral-8x7b")
    cluster = Cluster.preset("h100-sxm", nodes=2)
    graph = make_graph(cfg)
    ep = estimate(graph, cluster, make_plan(cfg, cluster, global_batch=64, seq_len=4096, dp=16, ep=8, zero=3))
    assert ep.comm_bytes["ep"] > 0 and ep.comm_bytes["cp"] == 0
    cp = estimate(graph, cluster, make_plan(cfg, cluster, global_batch=64, seq_len=4096, dp=8, cp=2, ep=8, zero=3))
    assert cp.comm_bytes["cp"] > 0
    # without ZeRO-3, expert parallelism is what shards the experts' weights
    ep1 = estimate(graph, cluster, make_plan(cfg, cluster, global_batch=64, seq_len=4096, dp=16, ep=8, zero=1))
    no_ep = estimate(graph, cluster, make_plan(cfg, cluster, global_batch=64, seq_len=4096, dp=16, zero=1))
    assert ep1.memory_bytes["params"] < no_ep.memory_bytes["params"] / 4
    assert ep1.comm_bytes["dp"] < no_ep.comm_bytes["dp"]


def test_cpu_preset_estimates_a_tiny_model_in_fp32(make_graph, make_plan) -> None:
    cfg = zoo.config("gpt-tiny")
    cpu = Cluster.preset("cpu")
    pred = estimate(make_graph(cfg), cpu, make_plan(cfg, cpu, global_batch=8, seq_len=128, dp=2, tp=2, dtype="float32"))
    assert 0 < pred.step_time_s < 10 and pred.peak_memory_bytes < pred.memory_limit_bytes
    with pytest.raises(ir.InvalidClusterError, match="no bfloat16 peak"):
        estimate(make_graph(cfg), cpu, make_plan(cfg, cpu, global_batch=8, seq_len=128, dp=4))


def test_world_size_mismatch_shows_the_arithmetic(make_graph, make_plan) -> None:
    cfg = zoo.config("gpt-tiny")
    two_nodes = Cluster.preset("h100-sxm", nodes=2)
    plan = make_plan(cfg, H100, global_batch=8, seq_len=128, dp=4, tp=2)
    with pytest.raises(ir.InvalidPlanError) as err:
        estimate(make_graph(cfg), two_nodes, plan)
    assert str(err.value) == "pp(1) * dp(4) * cp(1) * tp(2) = 8 != 16 GPUs of h100-sxm:2x8"


def test_float8_on_a100_is_refused(make_graph, make_plan) -> None:
    cfg = zoo.config("gpt-tiny")
    a100 = Cluster.preset("a100-80gb")
    with pytest.raises(ir.InvalidClusterError, match="no float8 peak"):
        estimate(make_graph(cfg), a100, make_plan(cfg, a100, global_batch=8, seq_len=128, dp=8, dtype="float8"))
    h100 = estimate(make_graph(cfg), H100, make_plan(cfg, H100, global_batch=8, seq_len=128, dp=8, dtype="float8"))
    assert h100.step_time_s > 0


@pytest.mark.parametrize("change, words", [
    (dict(tp=3), "tp(3) must divide heads(4)"),
    (dict(ep=2), "needs a mixture-of-experts model"),
])
def test_plans_the_model_cannot_take(make_graph, make_plan, change, words) -> None:
    cfg = zoo.config("gpt-tiny")
    cluster = Cluster.preset("cpu", gpus_per_node=6 if change.get("tp") == 3 else 4)
    kw = dict(global_batch=8, seq_len=128, dtype="float32", dp=cluster.world_size // change.get("tp", 1))
    plan = make_plan(cfg, cluster, **{**kw, **change})
    with pytest.raises(ir.InvalidPlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        estimate(make_graph(cfg), cluster, plan)


def test_recompute_must_cover_the_layers(make_graph, make_plan) -> None:
    cfg = zoo.config("gpt-tiny")
    plan = dataclasses.replace(make_plan(cfg, H100, global_batch=8, seq_len=128, dp=8), recompute=("none",) * 3)
    with pytest.raises(ir.InvalidPlanError, match="3 entries but the model has 4 layers"):
        estimate(make_graph(cfg), H100, plan)


def test_works_from_dims_alone_and_ignores_a_stale_prediction(make_graph, make_plan) -> None:
    cfg = zoo.config("llama3-8b")
    graph = make_graph(cfg)
    bare = ir.Graph(nodes=(), params=(), blocks=(), dims=graph.dims)
    plan = make_plan(cfg, H100, global_batch=8, seq_len=1024, dp=8)
    a, b = estimate(graph, H100, plan), estimate(bare, H100, plan)
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=0.01)
    stale = plan.with_prediction(dataclasses.replace(a, step_time_s=123.0))
    assert estimate(graph, H100, stale) == a


def test_summary_is_cached_per_graph_and_forgotten_with_it(make_graph) -> None:
    graph = make_graph(zoo.config("gpt-tiny"))
    assert summary_of(graph) is summary_of(graph)
    key = id(graph)
    assert key in summary_module._CACHE
    del graph
    gc.collect()
    assert key not in summary_module._CACHE


def test_pipeline_traffic_crosses_nodes_when_stages_do(make_graph, make_plan, make_gpt) -> None:
    cfg = make_gpt(16, 4096, 32)
    cluster = Cluster.preset("h100-sxm", nodes=2)
    plan = make_plan(cfg, cluster, global_batch=16, seq_len=2048, pp=2, tp=8)
    pred = estimate(make_graph(cfg), cluster, plan)
    act = 2048 * 4096 * 2
    assert pred.comm_bytes["pp"] == pytest.approx(16 * 2 * act)
    assert collective_time("send-recv", act, 2, 8, cluster) > collective_time("send-recv", act, 2, 1, cluster)


def test_a_tied_head_costs_the_last_stage_a_copy_and_an_all_reduce(make_graph, make_plan, make_gpt) -> None:
    """A head tied to the embedding (one table fewer in the graph's total): under pp the last stage holds a copy of
    the table, as an untied head's stage holds its own, and the two copies' gradients are all-reduced between
    the end stages once a step; without pp the model holds the table once."""
    from meshplan.cost_model.data_parallel import rank_params
    from meshplan.cost_model.memory import STATE_BYTES
    from meshplan.cost_model.pipeline import RankLayers

    cfg = make_gpt(8, 2048, 16, vocab=256000)
    cluster = Cluster.preset("h100-sxm", nodes=2)
    untied = make_graph(cfg)
    table = cfg.vocab * cfg.hidden
    tied = dataclasses.replace(untied, params=(ir.Param(name="all", shape=(untied.param_count - table,)),))
    assert summary_of(tied).tied_params == table and summary_of(untied).tied_params == 0
    piped = make_plan(cfg, cluster, global_batch=16, seq_len=2048, pp=2, dp=8)
    a, b = estimate(untied, cluster, piped), estimate(tied, cluster, piped)
    assert b.peak_memory_bytes == pytest.approx(a.peak_memory_bytes, rel=1e-6)
    last, ends = RankLayers(rank=1, none=4, last=True), RankLayers(rank=0, none=4, first=True, last=True)
    held = {name: rank_params(summary_of(g), last, 1, 1, expert_tp=True).dense
            for name, g in (("a", untied), ("b", tied))}
    assert held["b"] == pytest.approx(held["a"]) and held["b"] > 4 * summary_of(tied).layer_params + 0.99 * table
    assert rank_params(summary_of(tied), ends, 1, 1, expert_tp=True).dense < rank_params(
        summary_of(untied), ends, 1, 1, expert_tp=True).dense - 0.99 * table  # one stage: the table once
    all_reduce = collective_time("all-reduce", table * STATE_BYTES["bfloat16"][1], 2, 8, cluster)
    assert all_reduce > 0
    assert b.time_s["exposed_comm"] - a.time_s["exposed_comm"] == pytest.approx(all_reduce, rel=1e-6)
    whole = make_plan(cfg, cluster, global_batch=16, seq_len=2048, dp=16)
    params = {g: estimate(g, cluster, whole).memory_bytes["params"] for g in (tied, untied)}
    assert params[tied] < params[untied]
