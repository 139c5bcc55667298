"""Known answers for what the cost model charges meshplan's runtime on a CPU profile beyond FLOPs and
bytes: GELU, the loss's log-softmax and Adam's square root at their measured rates, the loss on
logits the runtime gathers under TP (and not under Megatron's vocab-parallel loss), fresh pages for
tensors of 32 MiB or more, the input-gradient all-reduce of each column-parallel Linear, and the SP
norms' Partial gradients all-reduced in the optimizer step."""
from __future__ import annotations

import dataclasses

import pytest

from meshplan.cost_model import cluster_from_profile, collective_time, memory_time_s, software_named
from meshplan.cost_model.layer_cost import LayerShape, edge_cost, layer_cost
from meshplan.cost_model.software import DEFAULT

from test_profile_cluster import synthetic_profile

GELU, GELU_BWD, LSM, LSM_BWD = 3e-9, 5e-9, 2e-9, 4e-9  # s per element, slower than memory (8 GB/s) here


def cluster(transcendental: bool = True, sync_s: float = 0.0):
    base = cluster_from_profile(synthetic_profile())
    rates = (("gelu", GELU), ("gelu_backward", GELU_BWD), ("log_softmax", LSM), ("log_softmax_backward", LSM_BWD))
    accel = dataclasses.replace(base.accelerator, transcendental_s_per_elem=rates if transcendental else (),
                                sync_overhead_s=sync_s)
    return dataclasses.replace(base, accelerator=accel)


@pytest.fixture
def dims(make_graph, make_gpt):
    return make_graph(make_gpt(4, 256, 8)).dims  # vocab 51200


def shape(dims, tp=1, sp=False, software=None, mb=4):
    extra = {"software": software} if software is not None else {}
    return LayerShape(dims=dims, micro_batch=mb, seq_len=128, tp=tp, sp=sp, dtype="float32", **extra)


@pytest.mark.parametrize("tp", [1, 4])
def test_gelu_runs_at_its_measured_rate(dims, tp) -> None:
    s = shape(dims, tp=tp)
    with_rate, without = layer_cost(s, cluster()), layer_cost(s, cluster(transcendental=False))
    ffn = 4 * 128 * dims.ffn_hidden / tp  # GELU's elements on one rank
    accel = cluster().accelerator
    assert with_rate.fwd_compute_s - without.fwd_compute_s == pytest.approx(
        GELU * ffn - memory_time_s(accel, 2 * ffn * 4, 0), rel=1e-9)
    assert with_rate.bwd_compute_s - without.bwd_compute_s == pytest.approx(
        GELU_BWD * ffn - memory_time_s(accel, 4 * ffn * 4, 0), rel=1e-9)


def test_the_loss_runs_log_softmax_at_its_measured_rate_on_the_logits_it_sees(dims) -> None:
    accel = cluster().accelerator
    tokens = 4 * 128
    for tp, software, logits in ((1, None, tokens * dims.vocab),  # one rank: all logits
                                 (4, None, tokens * dims.vocab / 4),  # meshplan: vocab-parallel (runtime.loss)
                                 (4, software_named("megatron-core-2024"), tokens * dims.vocab / 4),  # vocab-parallel
                                 # a software that gathers the logits runs the full loss on each rank
                                 (4, dataclasses.replace(DEFAULT, vocab_parallel_loss=False), tokens * dims.vocab)):
        s = shape(dims, tp=tp, software=software)
        a, b = edge_cost(s, cluster(), first=False, last=True), edge_cost(s, cluster(False), first=False, last=True)
        assert a.fwd_compute_s - b.fwd_compute_s == pytest.approx(
            LSM * logits - memory_time_s(accel, 8 * logits, 0), rel=1e-9)
        assert a.bwd_compute_s - b.bwd_compute_s == pytest.approx(
            LSM_BWD * logits - memory_time_s(accel, 12 * logits, 0), rel=1e-9)


GATHERING = dataclasses.replace(DEFAULT, vocab_parallel_loss=False)  # the whole-logits loss, for comparison


@pytest.mark.parametrize("sync_s", [0.0, 2e-3])
def test_the_tp_loss_path_is_vocab_parallel(dims, sync_s) -> None:
    c = cluster(sync_s=sync_s)
    tokens = 16 * 128
    # meshplan's runtime (runtime.loss, torch's loss_parallel): three all-reduces of one fp32 value per token
    per_token = 3 * (collective_time("all-reduce", 4 * tokens, 4, 1, c) + sync_s)
    meshplan = edge_cost(shape(dims, tp=4, mb=16), c, first=False, last=True)
    megatron = edge_cost(shape(dims, tp=4, mb=16, software=software_named("megatron-core-2024")), c,
                         first=False, last=True)
    gathering = edge_cost(shape(dims, tp=4, mb=16, software=GATHERING), c, first=False, last=True)
    assert meshplan.fwd_comm_s == pytest.approx(per_token, rel=1e-9) and megatron.fwd_comm_s == 0.0
    gather = collective_time("all-gather", tokens * dims.vocab * 4, 4, 1, c) + sync_s
    assert gathering.fwd_comm_s == pytest.approx(gather, rel=1e-9)
    assert gathering.comm_bytes_fwd["tp"] > meshplan.comm_bytes_fwd["tp"] > megatron.comm_bytes_fwd["tp"]
    # compute: a gathering loss runs on all V logits instead of V/4 (18 bytes each, memory-bound without
    # rates), and concatenates the gathered shards (the logits read and written once, one kernel)
    plain = cluster(transcendental=False)
    meshplan = edge_cost(shape(dims, tp=4, mb=16), plain, first=False, last=True)
    gathering = edge_cost(shape(dims, tp=4, mb=16, software=GATHERING), plain, first=False, last=True)
    logits = tokens * dims.vocab
    accel = plain.accelerator
    assert gathering.fwd_compute_s - meshplan.fwd_compute_s == pytest.approx(
        memory_time_s(accel, 18 * logits * 3 / 4, 0) + memory_time_s(accel, 2 * logits * 4, 1), rel=1e-9)
    assert gathering.bwd_compute_s - meshplan.bwd_compute_s == pytest.approx(
        memory_time_s(accel, 18 * logits * 3 / 4, 0), rel=1e-9)


def test_each_column_parallel_linear_all_reduces_its_input_gradient(dims) -> None:
    c = cluster(sync_s=1e-3)
    act = 4 * 128 * dims.hidden * 4
    one = collective_time("all-reduce", act, 4, 1, c) + 1e-3
    meshplan = layer_cost(shape(dims, tp=4), c)
    megatron = layer_cost(shape(dims, tp=4, software=software_named("megatron-core-2024")), c)
    # forward: 2 row-parallel all-reduces for both; backward: q, k, v and fc1 (4) against Megatron's 2
    assert meshplan.fwd_comm_s == pytest.approx(megatron.fwd_comm_s) == pytest.approx(2 * one)
    assert meshplan.bwd_comm_s == pytest.approx(4 * one) and megatron.bwd_comm_s == pytest.approx(2 * one)


def test_sp_norm_gradients_are_all_reduced_in_the_optimizer_step(make_graph, make_gpt, make_plan) -> None:
    from meshplan.cost_model import estimate
    from meshplan.cost_model.dispatch import partial_grad_allreduces

    cfg = make_gpt(4, 256, 8)
    graph = make_graph(cfg)
    quiet, waits = cluster(), cluster(sync_s=1e-3)
    sp = make_plan(cfg, quiet, global_batch=16, seq_len=128, tp=4, micro_batch=16, sp=True, dtype="float32")
    no_sp = dataclasses.replace(sp, sequence_parallel=False)
    calls = partial_grad_allreduces(graph.dims, layers=4, last=True, tp=4, sp=True)
    assert calls == 3 * 2 * (2 * 4 + 1)  # 3 reads per tensor, LayerNorm's 2 tensors, 2 norms a layer + the final
    # every call also waits sync_overhead_s; other calls of the step (TP layers) wait too, so compare the
    # optimizer's share: SP adds calls * sync where no-SP adds none
    def optimizer_s(plan, c):
        return estimate(graph, c, plan).time_s["compute"]
    assert optimizer_s(sp, waits) - optimizer_s(sp, quiet) == pytest.approx(calls * 1e-3, rel=1e-9)
    assert optimizer_s(no_sp, waits) == pytest.approx(optimizer_s(no_sp, quiet), rel=1e-12)


def test_adam_square_root_runs_at_its_measured_rate_on_the_optimizer_shard(make_graph, make_gpt, make_plan) -> None:
    from meshplan.cost_model import estimate

    cfg = make_gpt(4, 256, 8)
    graph = make_graph(cfg)
    base = cluster(transcendental=False)
    sqrt_s = 3e-9  # per element, above the memory-bound 1 ns of 8 bytes at 8 GB/s
    slow = dataclasses.replace(base, accelerator=dataclasses.replace(base.accelerator,
                                                                      transcendental_s_per_elem=(("sqrt", sqrt_s),)))
    total = graph.param_count
    for zero, shard in ((0, total), (1, total / 4)):  # ZeRO-1: each of 4 ranks steps a quarter
        plan = make_plan(cfg, base, global_batch=16, seq_len=128, dp=4, micro_batch=4, zero=zero, dtype="float32")
        extra = estimate(graph, slow, plan).time_s["compute"] - estimate(graph, base, plan).time_s["compute"]
        assert extra == pytest.approx(shard * (sqrt_s - 8 / 8e9), rel=1e-6)


def test_loss_tensors_of_32_mib_or_more_fault_in_fresh_pages(make_graph, make_gpt) -> None:
    from meshplan.cost_model.hardware import FRESH_PAGES_BYTES

    dims = make_graph(make_gpt(4, 256, 8, vocab=4096)).dims
    base = cluster(transcendental=False)
    per_byte = 4e-10
    faults = dataclasses.replace(base, accelerator=dataclasses.replace(base.accelerator,
                                                                        first_touch_s_per_byte=per_byte))

    def extra(s):
        a, b = edge_cost(s, faults, first=False, last=True), edge_cost(s, base, first=False, last=True)
        return a.fwd_compute_s - b.fwd_compute_s, a.bwd_compute_s - b.bwd_compute_s

    logits_bytes = 16 * 128 * 4096 * 4  # whole fp32 logits at micro-batch 16: 32 MiB
    assert logits_bytes == FRESH_PAGES_BYTES
    # a gathering loss at TP4: gathered buffer, concatenation, log-probabilities forward; 2 gradients backward
    assert extra(shape(dims, tp=4, mb=16, software=GATHERING)) == pytest.approx(
        (3 * logits_bytes * per_byte, 2 * logits_bytes * per_byte))
    # meshplan's vocab-parallel loss at TP4: 8 MiB of logits per rank reuse the heap
    assert extra(shape(dims, tp=4, mb=16)) == (0.0, 0.0)
    # one rank's micro-batch of 4: 8 MiB tensors reuse the heap
    assert extra(shape(dims, tp=1, mb=4)) == (0.0, 0.0)
