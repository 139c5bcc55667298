"""Invariants of the cost model (hypothesis): costs never fall as the work grows."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import ir, zoo
from meshplan.cost_model import (Cluster, collective_time, estimate, layer_activation_bytes, matmul_time_s,
                                 memory_breakdown)

CLUSTER = Cluster.preset("h100-sxm", nodes=8)
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast")
FAST = settings(max_examples=60, deadline=None)


@st.composite
def groups(draw):
    stride = draw(st.sampled_from([1, 2, 4, 8, 16]))
    size = draw(st.integers(1, 64 // stride))
    return size, stride


@st.composite
def dims(draw):
    family = draw(st.sampled_from(["gpt", "llama", "moe"]))
    heads = draw(st.sampled_from([4, 8, 16, 32]))
    hidden = heads * draw(st.sampled_from([32, 64, 128]))
    kv = heads if family == "gpt" else draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    experts = draw(st.sampled_from([4, 8])) if family == "moe" else 0
    return ir.ModelDims(family=family, layers=draw(st.integers(1, 8)), hidden=hidden, heads=heads, kv_heads=kv,
                        ffn_hidden=hidden * draw(st.sampled_from([2, 3, 4])), vocab=draw(st.sampled_from([512, 32000])),
                        experts=experts, top_k=min(2, experts))


@FAST
@given(kind=st.sampled_from(KINDS), group=groups(), small=st.floats(0, 1e10), extra=st.floats(0, 1e10))
def test_more_bytes_never_take_less_time(kind, group, small, extra) -> None:
    size, stride = group
    assert collective_time(kind, small + extra, size, stride, CLUSTER) >= collective_time(kind, small, size, stride,
                                                                                          CLUSTER)


@FAST
@given(m=st.integers(1, 8192), n=st.integers(1, 8192), k=st.integers(1, 8192), grow=st.integers(1, 4096))
def test_a_bigger_matmul_never_takes_less_time(m, n, k, grow) -> None:
    accel = CLUSTER.accelerator
    base = matmul_time_s(accel, "bfloat16", m, n, k, 2)
    assert matmul_time_s(accel, "bfloat16", m + grow, n, k, 2) >= base
    assert matmul_time_s(accel, "bfloat16", m, n, k + grow, 2) >= base


@FAST
@given(d=dims(), seq=st.sampled_from([128, 1024, 4096]), mb=st.integers(1, 8), tp=st.sampled_from([1, 2, 4]),
       sp=st.booleans(), flash=st.booleans(), dropout=st.booleans())
def test_activation_memory_orders(d, seq, mb, tp, sp, flash, dropout) -> None:
    sp = sp and tp > 1
    act = lambda **kw: layer_activation_bytes(d, seq_len=seq, **{**dict(micro_batch=mb, tp=tp, sp=sp, flash=flash,
                                                                        dropout=dropout), **kw})
    assert act(recompute="full") <= act(recompute="selective") <= act(recompute="none")
    assert act(micro_batch=mb + 1) >= act()
    assert act(tp=tp * 2, sp=sp) <= act()


def _graph(cfg):
    return ir.Graph(nodes=(), params=(ir.Param(name="all", shape=(zoo.param_count(cfg),)),), blocks=(),
                    dims=ir.ModelDims(family=cfg.family, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
                                      kv_heads=cfg.kv_heads, ffn_hidden=cfg.ffn_hidden, vocab=cfg.vocab))


LLAMA = zoo.config("llama3-8b", layers=8)
GRAPH = _graph(LLAMA)


def _plan(cluster, *, tp=1, dp=1, pp=1, mb=1, gb=16, zero=0, recompute="none", schedule="1f1b", sp=False):
    stages = tuple((i * LLAMA.layers // pp, (i + 1) * LLAMA.layers // pp) for i in range(pp)) if pp > 1 else ()
    return ir.Plan(model=LLAMA.to_dict(), cluster=cluster.spec, global_batch=gb, seq_len=2048,
                   mesh=ir.Mesh(tp=tp, dp=dp, pp=pp), zero_stage=zero, sequence_parallel=sp, micro_batch_size=mb,
                   num_microbatches=gb // (mb * dp), schedule=schedule, recompute=(recompute,) * LLAMA.layers,
                   stages=stages)


@FAST
@given(dp=st.sampled_from([1, 2]), zero=st.integers(0, 3), small=st.sampled_from([1, 2, 4]), sp=st.booleans())
def test_more_tp_never_more_parameter_memory_per_gpu(dp, zero, small, sp) -> None:
    def params(tp):
        world = tp * dp
        cluster = Cluster.preset("h100-sxm", nodes=max(world // 8, 1), gpus_per_node=min(world, 8))
        return memory_breakdown(GRAPH, cluster, _plan(cluster, tp=tp, dp=dp, zero=zero, sp=sp and tp > 1))["params"]
    assert params(2 * small) <= params(small)


@FAST
@given(pp=st.sampled_from([1, 2, 4]), mb=st.sampled_from([1, 2, 4]), schedule=st.sampled_from(["1f1b", "gpipe",
                                                                                              "zero-bubble"]))
def test_plan_level_activation_orders(pp, mb, schedule) -> None:
    cluster = Cluster.preset("h100-sxm", nodes=1, gpus_per_node=pp)
    act = lambda **kw: memory_breakdown(GRAPH, cluster, _plan(cluster, **{**dict(pp=pp, mb=mb, schedule=schedule),
                                                                           **kw}))["activations"]
    assert act(recompute="full") <= act(recompute="none")
    # twice the tokens per micro-batch, as many micro-batches (not act(mb=2 * mb) >= act(): autocast's
    # weight copies are per micro-batch in flight, so GPipe with fewer, larger ones may hold less)
    assert act(mb=2 * mb, gb=32) >= act()


@FAST
@given(tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2]), zero=st.integers(0, 3),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_more_work_never_takes_less_time(tp, pp, zero, recompute) -> None:
    cluster = Cluster.preset("h100-sxm", nodes=2)
    dp = 16 // (tp * pp)
    kw = dict(tp=tp, pp=pp, dp=dp, zero=zero, recompute=recompute)
    small = estimate(GRAPH, cluster, _plan(cluster, gb=2 * dp, **kw))
    large = estimate(GRAPH, cluster, _plan(cluster, gb=4 * dp, **kw))
    assert large.step_time_s >= small.step_time_s
    assert abs(sum(large.time_s.values()) - large.step_time_s) <= 1e-9 * large.step_time_s
    none = estimate(GRAPH, cluster, _plan(cluster, gb=2 * dp, **{**kw, "recompute": "none"}))
    assert small.step_time_s >= none.step_time_s  # recomputation costs time
