"""The program the plan runs under (cost_model.software): unfused attention, what overlaps, and
DeepSpeed's ZeRO-3, against the per-layer times Korthikanti et al. 2022 measured (Table 4)."""
from __future__ import annotations

import dataclasses

import pytest

from meshplan import ir, zoo
from meshplan.cost_model import (DEFAULT_SOFTWARE, Cluster, LayerShape, Software, collective_time, estimate,
                                 flat_collective_time, layer_activation_bytes, layer_cost,
                                 plain_attention_fwd_bwd_s, software_named)
from meshplan.cost_model.layer_cost import layer_matmuls

A100 = Cluster.preset("a100-80gb")
MEGATRON = software_named("megatron-lm-2021")
GPT_22B = ir.ModelDims(family="gpt", layers=48, hidden=6144, heads=64, kv_heads=64, ffn_hidden=24576, vocab=51200)


def _layer_ms(sp: bool, recompute: str) -> float:
    """One layer of the 22B model, t = 8, b = 4, s = 2048, forward + backward (+ recompute), in ms."""
    shape = LayerShape(dims=GPT_22B, micro_batch=4, seq_len=2048, tp=8, sp=sp, software=MEGATRON)
    cost = layer_cost(shape, A100)
    fwd, bwd = cost.fwd_compute_s + cost.fwd_comm_s, cost.bwd_compute_s + cost.bwd_comm_s
    extra = {"none": 0.0, "full": fwd, "selective": cost.core_fwd_s}[recompute]
    return (fwd + bwd + extra) * 1e3


@pytest.mark.parametrize("sp, recompute, measured_ms", [
    (False, "none", 19.6), (True, "none", 19.0), (False, "full", 27.2), (False, "selective", 20.9),
    (True, "selective", 20.3)])
def test_layer_time_matches_korthikanti_table_4(sp, recompute, measured_ms) -> None:
    assert _layer_ms(sp, recompute) == pytest.approx(measured_ms, rel=0.10)


def test_selective_recompute_costs_the_unfused_core_forward() -> None:
    """Table 4: selective recomputation adds 1.3 ms to the backward (13.2 - 11.9), the core's forward."""
    assert _layer_ms(False, "selective") - _layer_ms(False, "none") == pytest.approx(1.3, rel=0.25)


def test_plain_attention_costs_more_than_flash_and_grows_with_the_sequence() -> None:
    accel = A100.accelerator
    kw = dict(batch_heads=32, head_dim=96, elem_bytes=2, dropout=True)
    short = plain_attention_fwd_bwd_s(accel, "bfloat16", q_len=1024, kv_len=1024, **kw)
    long = plain_attention_fwd_bwd_s(accel, "bfloat16", q_len=2048, kv_len=2048, **kw)
    assert long[0] > 3 * short[0] and long[1] > 3 * short[1]  # the s^2 traffic dominates
    flash = LayerShape(dims=GPT_22B, micro_batch=4, seq_len=2048, tp=8)
    plain = dataclasses.replace(flash, software=MEGATRON)
    assert layer_cost(plain, A100).core_fwd_s > 3 * layer_cost(flash, A100).core_fwd_s


def test_plain_attention_keeps_the_scores_in_memory(make_graph, make_plan, make_gpt) -> None:
    cfg = make_gpt(24, 2304, 24)
    cluster = Cluster.preset("a100-80gb", nodes=1)
    plan = make_plan(cfg, cluster, global_batch=8, seq_len=2048, dp=8)
    flash = estimate(make_graph(cfg), cluster, plan)
    plain = estimate(make_graph(cfg), cluster, plan, software=MEGATRON)
    assert plain.memory_bytes["activations"] > flash.memory_bytes["activations"]
    assert plain.step_time_s > flash.step_time_s
    sbh, a_s_h = 2048 * 2304, 24 * 2048 / 2304
    assert layer_activation_bytes(cfg_dims(cfg), seq_len=2048, micro_batch=1, flash=False, dropout=True) == (
        pytest.approx(sbh * (34 + 5 * a_s_h)))


def cfg_dims(cfg) -> ir.ModelDims:
    return ir.ModelDims(family="gpt", layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, kv_heads=cfg.heads,
                        ffn_hidden=cfg.ffn_hidden, vocab=cfg.vocab)


def test_flat_collectives_cost_more_only_across_nodes() -> None:
    cluster = Cluster.preset("a100-80gb", nodes=4)
    for kind in ("all-gather", "reduce-scatter", "all-reduce"):
        inside = (kind, 1e9, 8, 1, cluster)
        assert flat_collective_time(*inside) == pytest.approx(collective_time(*inside))
        across = (kind, 1e9, 32, 1, cluster)
        assert flat_collective_time(*across) > 4 * collective_time(*across)


def test_deepspeed_zero3_is_bound_by_its_traffic(make_graph, make_plan, make_gpt) -> None:
    """Narayanan et al. 2021 Table 2: at a fixed batch, doubling the GPUs leaves the step time of
    ZeRO-3 about unchanged (88 -> 44 TFLOP/s per GPU); FSDP with prefetching would nearly halve it."""
    cfg = make_gpt(96, 12288, 96)
    graph = make_graph(cfg)
    steps = {}
    for software in (software_named("deepspeed-zero3-2021"), DEFAULT_SOFTWARE):
        for gpus, mb in ((768, 2), (1536, 1)):
            cluster = Cluster.preset("a100-80gb", nodes=gpus // 8)
            plan = make_plan(cfg, cluster, global_batch=1536, seq_len=2048, dp=gpus, micro_batch=mb, zero=3,
                             recompute="full")
            steps[software.name, gpus] = estimate(graph, cluster, plan, software=software).step_time_s
    assert steps["deepspeed-zero3-2021", 1536] / steps["deepspeed-zero3-2021", 768] > 0.8
    assert steps["meshplan", 1536] / steps["meshplan", 768] < 0.6


def test_reductions_after_the_backward_are_exposed(make_graph, make_plan, make_gpt) -> None:
    cfg = make_gpt(24, 2048, 16)
    cluster = Cluster.preset("h100-sxm", nodes=4)
    plan = make_plan(cfg, cluster, global_batch=64, seq_len=2048, dp=32, micro_batch=2)
    overlapped = estimate(make_graph(cfg), cluster, plan)
    after = estimate(make_graph(cfg), cluster, plan,
                     software=Software(name="no-overlap", overlap_grad_reduce=False, fp32_grad_reduce=True))
    assert after.time_s["exposed_comm"] > overlapped.time_s["exposed_comm"]
    assert after.comm_bytes == overlapped.comm_bytes  # the same bytes, only less hidden


def test_tp_comm_overlap_hides_sequence_parallel_traffic(make_graph, make_plan, make_gpt) -> None:
    cfg = make_gpt(24, 8192, 64)
    cluster = Cluster.preset("h100-sxm", nodes=1)
    graph = make_graph(cfg)
    overlap = dataclasses.replace(DEFAULT_SOFTWARE, name="tp-overlap", tp_comm_overlap=True)  # only that differs
    sp = make_plan(cfg, cluster, global_batch=8, seq_len=4096, tp=8, sp=True)
    assert estimate(graph, cluster, sp, software=overlap).time_s["exposed_comm"] < estimate(
        graph, cluster, sp).time_s["exposed_comm"]
    no_sp = make_plan(cfg, cluster, global_batch=8, seq_len=4096, tp=8)  # needs SP: nothing changes
    assert estimate(graph, cluster, no_sp, software=overlap).step_time_s == pytest.approx(
        estimate(graph, cluster, no_sp).step_time_s)


def test_bad_software_says_what_is_known() -> None:
    with pytest.raises(ir.PlanError, match="attention must be one of"):
        Software(name="x", attention="paged")
    with pytest.raises(ir.PlanError, match="known: meshplan, torchtitan, megatron-lm-2021"):
        software_named("jax")


def test_every_fsdp_unit_pays_the_collective_latency(make_graph, make_plan, make_gpt) -> None:
    """FSDP gathers one layer at a time: at the same parameter count, more layers mean more calls."""
    cluster = Cluster.preset("h100-sxm", nodes=1)
    few, many = make_gpt(4, 1024, 8, vocab=1024), make_gpt(64, 256, 8, vocab=1024)  # ~50M parameters each
    exposed = {}
    for name, cfg in (("few", few), ("many", many)):
        plan = make_plan(cfg, cluster, global_batch=8, seq_len=512, dp=8, zero=3)
        exposed[name] = estimate(make_graph(cfg), cluster, plan, software=Software(
            name="no-prefetch", zero3_prefetch_params=1.0)).time_s["exposed_comm"]
    assert exposed["many"] > exposed["few"]


def test_meshplan_zero1_moves_three_psi_megatron_two(make_graph, make_plan, make_gpt) -> None:
    """Megatron: reduce-scatter + all-gather, 2 Psi (n-1)/n. torch: DDP's all-reduce, the same 2 Psi
    (n-1)/n, then ZeroRedundancyOptimizer broadcasts every parameter from its owner: Psi more. meshplan's runtime
    keeps fp32 parameters and reduces fp32 gradients (codegen.precision.REDUCE_DTYPE): each at 4 bytes."""
    from meshplan.cost_model.summary import summary_of

    cfg = make_gpt(8, 1024, 8)
    cluster = Cluster.preset("h100-sxm", nodes=1)
    plan = make_plan(cfg, cluster, global_batch=8, seq_len=512, dp=8, zero=1)
    graph = make_graph(cfg)
    ours = estimate(graph, cluster, plan).comm_bytes["dp"]
    megatron = estimate(graph, cluster, plan, software=MEGATRON).comm_bytes["dp"]
    psi = summary_of(graph).total_params
    assert megatron == pytest.approx(2 * 2 * psi * 7 / 8)  # bf16 gradients and parameters
    assert ours == pytest.approx(2 * 4 * psi * 7 / 8 + 4 * psi)


def test_torch_zero1_broadcasts_each_parameter_tensor(make_graph, make_plan, make_gpt) -> None:
    """One broadcast call per parameter tensor (no bucket view): each call pays the latency."""
    from meshplan.cost_model.data_parallel import RankParams, data_parallel_cost

    cluster = Cluster.preset("h100-sxm", nodes=1)
    one, many = (RankParams(dense=1e8, expert=0.0, bucket=1e7, units=9, tensors=n) for n in (1, 101))
    cost = [data_parallel_cost(p, cluster=cluster, mesh=ir.Mesh(dp=8), zero_stage=1, dtype="bfloat16",
                               microbatches=1, fwd_window_s=0.0, bwd_window_s=0.0) for p in (one, many)]
    latency = collective_time("broadcast", 1.0, 8, 1, cluster)
    assert cost[1].per_step_s - cost[0].per_step_s == pytest.approx(100 * latency, rel=1e-6)


def test_megatron_cuts_its_gradients_into_buckets_that_grow_with_dp() -> None:
    """Megatron-Core's buckets hold max(40M, 1M x dp) parameters (distributed_data_parallel.py), PyTorch DDP's
    25 MiB: ZeRO-1 of 4e9 bf16 parameters over dp 256 (one rank per node, ring over the network) is
    ceil(4e9 / 256e6) = 16 reduce-scatters and 16 all-gathers, against 4e9 * 4 B / 25 MiB = 611 and
    4e9 * 2 B / 25 MiB = 306; each call pays the ring's 255 hops."""
    from meshplan.cost_model.data_parallel import RankParams, data_parallel_cost
    cluster = Cluster.preset("h100-sxm", nodes=256)
    params = RankParams(dense=4e9, expert=0.0, bucket=4e9 / 60, units=61)
    mesh = ir.Mesh(dp=256, tp=8)
    waits = dataclasses.replace(software_named("megatron-core-2024"), overlap_grad_reduce=False, overlap_param_gather=False,
                                megatron_buckets=False)

    def step_s(software: Software) -> float:
        return data_parallel_cost(params, cluster=cluster, mesh=mesh, zero_stage=1, dtype="bfloat16", microbatches=1,
                                  fwd_window_s=0.0, bwd_window_s=0.0, software=software).per_step_s

    rs, ag = (collective_time(k, 1.0, 256, 8, cluster) for k in ("reduce-scatter", "all-gather"))
    assert rs == pytest.approx(255 * cluster.tiers[-1].latency_s, rel=1e-6)
    ddp, megatron = step_s(waits), step_s(dataclasses.replace(waits, megatron_buckets=True))
    assert ddp - megatron == pytest.approx((611 - 16) * rs + (306 - 16) * ag, rel=1e-6)


def _dp_cost(software: Software, *, zero: int, window_s: float, microbatches: int = 1):
    from meshplan.cost_model.data_parallel import RankParams, data_parallel_cost
    cluster = Cluster.preset("a100-80gb", nodes=16)
    params = RankParams(dense=8e9, expert=0.0, bucket=8e9 / 32, units=33)
    return data_parallel_cost(params, cluster=cluster, mesh=ir.Mesh(dp=64, tp=2), zero_stage=zero,
                              dtype="bfloat16", microbatches=microbatches, fwd_window_s=window_s,
                              bwd_window_s=2 * window_s, software=software)


@pytest.mark.parametrize("zero", [0, 3])
def test_hidden_communication_slows_compute_by_the_measured_share(zero: int) -> None:
    """Lee et al. 2025: compute runs 18.9% slower beside a collective. Under a long window everything
    hides, so the slowdown is 0.189 x all the communication; under no window nothing hides, so none."""
    plain = dataclasses.replace(DEFAULT_SOFTWARE, zero_copy_buffers=False)
    free = dataclasses.replace(plain, overlap_slowdown=0.0)
    long = _dp_cost(plain, zero=zero, window_s=1e3)
    assert long.per_microbatch_s + long.per_step_s < 0.05  # only the last bucket waits
    comm = _dp_cost(free, zero=zero, window_s=0.0)
    slowed = long.compute_per_microbatch_s + long.compute_per_step_s
    exposed = comm.per_microbatch_s + comm.per_step_s
    tail = long.per_microbatch_s + long.per_step_s
    assert slowed == pytest.approx(0.189 * (exposed - tail), rel=1e-6)
    none = _dp_cost(plain, zero=zero, window_s=0.0)
    assert none.compute_per_microbatch_s + none.compute_per_step_s == 0.0


def test_fsdp2_buffer_copies_cost_two_passes_over_each_collective() -> None:
    """ZeRO-3 per micro-batch: two all-gathers of 8e9 bf16 parameters and one reduce-scatter of their fp32
    gradients (meshplan's runtime reduces in fp32), each copied out of (into) its flat buffer: 2 x (16 + 16 + 32) GB
    read and written at HBM speed."""
    base = dataclasses.replace(DEFAULT_SOFTWARE, overlap_slowdown=0.0)
    accel = Cluster.preset("a100-80gb").accelerator
    with_copies = _dp_cost(base, zero=3, window_s=0.0)
    without = _dp_cost(dataclasses.replace(base, zero_copy_buffers=False), zero=3, window_s=0.0)
    expected = 2 * 8e9 * (2 + 2 + 4) / (accel.memory_bw_Bps * accel.memory_efficiency)
    assert with_copies.compute_per_microbatch_s - without.compute_per_microbatch_s == pytest.approx(expected)
    assert _dp_cost(base, zero=1, window_s=0.0).compute_per_step_s == 0.0  # ZeRO-1: DDP buckets, no copies


def test_cpu_ranks_pay_no_contention_since_nothing_overlaps() -> None:
    from meshplan.cost_model.data_parallel import RankParams, data_parallel_cost
    cluster = Cluster.preset("cpu", gpus_per_node=4)
    params = RankParams(dense=1e6, expert=0.0, bucket=1e5, units=5)
    cost = data_parallel_cost(params, cluster=cluster, mesh=ir.Mesh(dp=4), zero_stage=0, dtype="float32",
                              microbatches=1, fwd_window_s=10.0, bwd_window_s=10.0)
    assert cost.compute_per_step_s == 0.0 and cost.per_step_s > 0.0


def test_fsdp_under_torch_pipelining_reduces_once_after_the_schedule() -> None:
    """PipelineStage turns FSDP2's gradient sync off for each micro-batch and reduces after the
    schedule: ZeRO-2 under pp moves one gather and one reduce-scatter per step whatever the
    micro-batch count, and the reduce-scatter waits (nothing left to hide it under)."""
    from meshplan.cost_model.data_parallel import RankParams, data_parallel_cost
    cluster = Cluster.preset("a100-80gb", nodes=16)
    params = RankParams(dense=4e9, expert=0.0, bucket=4e9 / 16, units=17)
    cost = {m: data_parallel_cost(params, cluster=cluster, mesh=ir.Mesh(pp=2, dp=32, tp=2), zero_stage=2,
                                  dtype="bfloat16", microbatches=m, fwd_window_s=10.0, bwd_window_s=20.0)
            for m in (4, 16)}
    assert cost[4].bus_bytes == cost[16].bus_bytes and cost[4].per_microbatch_s == 0.0
    rs = collective_time("reduce-scatter", 4e9 * 4, 32, 2, cluster) + 16 * collective_time(  # fp32 gradients
        "reduce-scatter", 1.0, 32, 2, cluster)
    ag = collective_time("all-gather", 4e9 * 2, 32, 2, cluster) + 16 * collective_time(
        "all-gather", 1.0, 32, 2, cluster)
    assert cost[4].per_step_s == pytest.approx(rs + ag / 16)  # and the first unit's gather, which nothing hides
    flat = data_parallel_cost(params, cluster=cluster, mesh=ir.Mesh(dp=32, tp=2), zero_stage=2, dtype="bfloat16",
                              microbatches=4, fwd_window_s=10.0, bwd_window_s=20.0)
    assert flat.bus_bytes == pytest.approx(4 * cost[4].bus_bytes)  # without pp: per micro-batch


def test_cpu_collectives_each_wait_for_the_last_rank() -> None:
    from meshplan.cost_model.data_parallel import RankParams, data_parallel_cost
    cluster = Cluster.preset("cpu", gpus_per_node=4)
    slow = dataclasses.replace(cluster, accelerator=dataclasses.replace(cluster.accelerator, sync_overhead_s=1e-3))
    params = RankParams(dense=1e6, expert=0.0, bucket=1e5, units=5)
    cost = [data_parallel_cost(params, cluster=c, mesh=ir.Mesh(dp=4), zero_stage=3, dtype="float32",
                               microbatches=1, fwd_window_s=0.0, bwd_window_s=0.0) for c in (cluster, slow)]
    # ZeRO-3: gather forward, gather backward, reduce-scatter, one call per FSDP unit each
    assert cost[1].per_microbatch_s - cost[0].per_microbatch_s == pytest.approx(3 * 5 * 1e-3)


def test_gradients_at_the_peak_are_those_the_program_still_holds(make_graph, make_plan, make_gpt) -> None:
    """DDP's gradients are views into its buckets, which outlive zero_grad: always held. FSDP2 frees
    them between steps, so with one micro-batch the first backward's peak starts without them; a second
    micro-batch's backward holds the first one's."""
    from meshplan.cost_model.summary import summary_of

    cfg = make_gpt(2, 256, 8, vocab=4096, seq=128)
    graph = make_graph(cfg)
    cluster = Cluster.preset("h100-sxm", nodes=1)
    params = summary_of(graph).total_params
    breakdown = lambda **kw: estimate(graph, cluster, make_plan(cfg, cluster, seq_len=128, dp=8, **kw)).memory_bytes  # noqa: E731
    ddp = breakdown(global_batch=8)
    assert ddp["grads"] == pytest.approx(4 * params)  # fp32 gradients (fp32 parameters under autocast)
    one, two = breakdown(global_batch=8, zero=3), breakdown(global_batch=16, zero=3)
    assert two["grads"] == pytest.approx(4 * params / 8)
    assert one["activations"] > 4 * params / 8 and one["grads"] == 0.0


@pytest.mark.parametrize("zero, share", [(0, 1.0), (2, 1 / 8)])
def test_each_later_micro_batch_adds_its_gradients_in_one_pass(make_graph, make_plan, make_gpt, zero, share) -> None:
    """m micro-batches: m - 1 passes that read the accumulated and the new gradients and write the sum
    (DDP: all of them; FSDP2's ZeRO-2: the reduce-scattered shard, 1/dp)."""
    from meshplan.cost_model.summary import summary_of

    cfg = make_gpt(2, 256, 8, vocab=4096, seq=128)
    graph = make_graph(cfg)
    cluster = Cluster.preset("h100-sxm", nodes=1)
    plan = make_plan(cfg, cluster, global_batch=32, seq_len=128, dp=8, zero=zero)  # 4 micro-batches of 1
    without = dataclasses.replace(DEFAULT_SOFTWARE, grad_accumulation_add=False)
    extra = estimate(graph, cluster, plan).time_s["compute"] - estimate(graph, cluster, plan, software=without).time_s["compute"]
    accel = cluster.accelerator
    expect = 3 * 3 * 2 * summary_of(graph).total_params * share / (accel.memory_bw_Bps * accel.memory_efficiency)
    assert extra == pytest.approx(expect, rel=1e-6)


def test_selective_recompute_repeats_what_the_program_does_not_save(make_graph, make_gpt, make_plan) -> None:
    """Korthikanti's policy (Megatron) recomputes the attention core; meshplan's runtime saves only the
    matmul and collective outputs (codegen.program.SELECTIVE_SAVE_OPS), so its backward repeats every
    other op of the forward: the attention core and the memory-bound ops."""
    from meshplan.cost_model.layer_cost import matmul_s

    args = dict(dims=GPT_22B, micro_batch=4, seq_len=2048, tp=8, sp=True)
    megatron = layer_cost(LayerShape(**args, software=MEGATRON), A100)
    assert megatron.selective_fwd_s == megatron.core_fwd_s
    ours_shape = LayerShape(**args, software=DEFAULT_SOFTWARE)
    ours = layer_cost(ours_shape, A100)
    assert ours.selective_fwd_s == pytest.approx(ours.fwd_compute_s - matmul_s(ours_shape, A100)[0], rel=1e-12)
    assert ours.core_fwd_s < ours.selective_fwd_s < ours.fwd_compute_s
    # one GPU, nothing to overlap: the step grows by each selective layer's repeated forward, exactly
    cfg = make_gpt(4, 1024, 16)
    graph, one = make_graph(cfg), Cluster.preset("a100-80gb", gpus_per_node=1)
    time = {r: estimate(graph, one, make_plan(cfg, one, global_batch=4, seq_len=2048, micro_batch=4, recompute=r)).step_time_s
            for r in ("none", "selective")}
    layer = layer_cost(LayerShape(dims=graph.dims, micro_batch=4, seq_len=2048, software=DEFAULT_SOFTWARE), one)
    # the preset's calibration (estimate.calibrated) scales the priced compute outside the attention core, the
    # recomputation in it too
    c = one.accelerator.calibration
    assert time["selective"] - time["none"] == pytest.approx(
        4 * (layer.selective_fwd_s + (layer.selective_fwd_s - layer.core_fwd_s) * (1 / c - 1)), rel=1e-9)


def test_megatron_dropout_is_gpts_default_and_llama_models_run_without_it() -> None:
    """Megatron's TransformerConfig defaults hidden and attention dropout to 0.1, which its GPT configs keep;
    Llama-style models set both to 0 (Megatron-Bridge LlamaBridge), so a Llama layer under a Megatron preset
    keeps no masks and writes none."""
    mcore = software_named("megatron-core-2024")
    assert mcore.drops_out("gpt") and not mcore.drops_out("llama") and not mcore.drops_out("moe")
    assert not DEFAULT_SOFTWARE.drops_out("gpt")
    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    gpt = dataclasses.replace(llama, family="gpt", kv_heads=32, ffn_hidden=16384)
    off = dataclasses.replace(mcore, name="mcore-no-dropout", dropout=False)
    kw = dict(micro_batch=1, seq_len=4096, tp=4, sp=True)
    time = lambda dims, sw: layer_cost(LayerShape(dims=dims, software=sw, **kw), A100).fwd_compute_s
    assert time(llama, mcore) == time(llama, off)  # no masks either way
    assert time(gpt, mcore) > time(gpt, off)  # two 1-byte masks written per token
    mem = lambda dims, sw: layer_activation_bytes(dims, seq_len=4096, micro_batch=1, dropout=sw.drops_out(dims.family))
    assert mem(llama, mcore) == mem(llama, off) and mem(gpt, mcore) > mem(gpt, off)


def test_a_flashattention_1_era_kernel_runs_the_core_at_its_published_rate() -> None:
    """llm-foundry's 2023 tables ran Tri Dao's FA1-era Triton kernel: 0.44 of FlashAttention-2's rate (FA2 paper
    Fig. 4: 68 against 155 TFLOPs/s at 2k on A100), so the attention core takes 1/0.44 as long (beyond the fixed
    per-kernel cost) and nothing else in the layer changes."""
    foundry = software_named("llm-foundry-2023")
    assert foundry.attention_speed == pytest.approx(68 / 155, abs=0.01)
    shape = LayerShape(dims=GPT_22B, micro_batch=4, seq_len=2048, tp=1, software=DEFAULT_SOFTWARE)
    fa2 = layer_cost(shape, A100)
    fa1 = layer_cost(dataclasses.replace(shape, software=dataclasses.replace(DEFAULT_SOFTWARE, attention_speed=0.44)),
                     A100)
    overhead = A100.accelerator.kernel_overhead_s
    assert fa1.core_fwd_s - overhead == pytest.approx((fa2.core_fwd_s - overhead) / 0.44)
    assert fa1.fwd_compute_s - fa1.core_fwd_s == pytest.approx(fa2.fwd_compute_s - fa2.core_fwd_s)
    with pytest.raises(ir.PlanError, match="attention_speed"):
        Software(name="bad", attention_speed=0.0)


def test_fp8_quantizes_the_four_gemm_inputs_forward_and_their_output_gradients_backward() -> None:
    """Transformer Engine's cast_transpose reads each bf16 operand once and writes a rowwise and a transposed
    FP8 copy (Hopper): 4 bytes per element, for the inputs of QKV, projection, fc1, fc2 in the forward and
    their output gradients in the backward; nothing in bf16."""
    from meshplan.cost_model.layer_cost import fp8_cast_bytes

    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    h, kv, f, m = 4096, 1024, 14336, 2 * 4096
    shape = LayerShape(dims=llama, micro_batch=2, seq_len=4096, dtype="float8", software=software_named("megatron-core-2024"))
    fwd, fk, bwd, bk = fp8_cast_bytes(shape)
    assert fwd == 4 * m * (2 * h + h + f) and bwd == 4 * m * ((h + 2 * kv) + 2 * h + 2 * f) and fk == bk == 4
    assert fp8_cast_bytes(dataclasses.replace(shape, dtype="bfloat16")) == (0.0, 0, 0.0, 0)
    tp4 = fp8_cast_bytes(dataclasses.replace(shape, tp=4, sp=True))
    assert tp4[0] == pytest.approx(fwd / 4) and tp4[2] == pytest.approx(bwd / 4)
    # the casts are memory-bound time the layer pays on top of its bf16 memory traffic
    H100 = Cluster.preset("h100-sxm")
    accel = H100.accelerator
    with_casts = layer_cost(shape, H100)
    from meshplan.cost_model.layer_cost import _compute_s, elementwise_fwd
    moved, kernels = elementwise_fwd(shape)
    assert with_casts.fwd_compute_s - with_casts.core_fwd_s - _compute_s(shape, H100)[4] == pytest.approx(
        (moved + fwd) / (accel.memory_bw_Bps * accel.memory_efficiency) + (kernels + 4) * accel.kernel_overhead_s)


def test_fp8_keeps_gemm_inputs_in_one_byte() -> None:
    """TE saves the quantized (1-byte) input of its GEMMs: the two norm outputs and fc2's input halve; under
    the default delayed scaling the projection's input is kept once more as an FP8 copy."""
    from meshplan.cost_model import activation_units

    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    r16, s16, c16 = activation_units(llama, seq_len=4096)
    r8, s8, c8 = activation_units(llama, seq_len=4096, fp8=True)
    assert r16 - r8 == 2.0 and s8 - s16 == pytest.approx((4096 - 14336) / 4096) and c8 == c16
    kw = dict(seq_len=4096, micro_batch=1, tp=4, sp=True)
    assert layer_activation_bytes(llama, dtype="float8", **kw) < layer_activation_bytes(llama, **kw)


def test_a_fused_cross_entropy_keeps_the_16_bit_logits_and_no_fp32_copy(make_graph, make_plan, make_gpt) -> None:
    """llm-foundry's loss is FlashAttention's fused kernel: 2 bytes a logit kept and 2 for their gradient,
    where the upcast log-softmax keeps 4 and holds 8 more at its backward. The difference is exactly
    the vocabulary-wide tensors of one micro-batch; the states do not move, and the buffers only by the
    caching allocator's share of the difference."""
    from meshplan.cost_model.footprint import ALLOCATOR_FRACTION

    cfg = make_gpt(2, 256, 8, vocab=32768, seq=512)
    cluster = Cluster.preset("h100-sxm", nodes=1)
    plan = make_plan(cfg, cluster, global_batch=32, seq_len=512, dp=8, zero=3)
    foundry = software_named("llm-foundry-2023")
    assert foundry.cross_entropy == "flash" and DEFAULT_SOFTWARE.cross_entropy == "upcast"
    upcast = dataclasses.replace(foundry, name="foundry-upcast-loss", cross_entropy="upcast")
    fused_mem = estimate(make_graph(cfg), cluster, plan, software=foundry).memory_bytes
    upcast_mem = estimate(make_graph(cfg), cluster, plan, software=upcast).memory_bytes
    logits = plan.micro_batch_size * 512 * 32768
    assert upcast_mem["activations"] - fused_mem["activations"] == pytest.approx(logits * ((4 + 8) - (2 + 2)))
    assert all(fused_mem[k] == upcast_mem[k] for k in ("params", "grads", "optimizer"))
    assert upcast_mem["buffers"] - fused_mem["buffers"] == pytest.approx(
        ALLOCATOR_FRACTION * logits * ((4 + 8) - (2 + 2)))


def test_a_fused_cross_entropy_moves_4_bytes_a_logit_each_way_not_18() -> None:
    """The output layer's loss under llm-foundry's fused kernel: the same matmuls, and the logits' memory
    traffic cut from 18 to 4 bytes a logit forward and backward, timed at the HBM rate."""
    from meshplan.cost_model.kernels import memory_time_s
    from meshplan.cost_model.layer_cost import edge_cost

    dims = ir.ModelDims(family="gpt", layers=2, hidden=768, heads=12, kv_heads=12, ffn_hidden=3072, vocab=50368)
    cluster = Cluster.preset("a100-80gb", nodes=1)
    foundry = software_named("llm-foundry-2023")
    upcast = dataclasses.replace(foundry, name="foundry-upcast-loss", cross_entropy="upcast")
    cost = {sw.name: edge_cost(LayerShape(dims=dims, micro_batch=32, seq_len=2048, software=sw), cluster,
                               first=False, last=True) for sw in (foundry, upcast)}
    logits = 32 * 2048 * 50368
    norm = 4 * 32 * 2048 * 768 * 2
    accel = cluster.accelerator
    saved_f = memory_time_s(accel, 18 * logits + norm, 6) - memory_time_s(accel, 4 * logits + norm, 6)
    saved_b = memory_time_s(accel, 18 * logits + 2 * norm, 8) - memory_time_s(accel, 4 * logits + 2 * norm, 8)
    assert cost[upcast.name].fwd_compute_s - cost[foundry.name].fwd_compute_s == pytest.approx(saved_f)
    assert cost[upcast.name].bwd_compute_s - cost[foundry.name].bwd_compute_s == pytest.approx(saved_b)


def test_fp8_weights_take_one_byte_at_rest_and_on_the_wire_where_the_program_gathers_them_in_fp8(
        make_graph, make_plan) -> None:
    """NVIDIA's perf recipes keep FP8 weights (Megatron-Core --fp8-param-gather): per parameter 1 byte where the
    16-bit copy would be and 1 for the transposed copy the backward takes, against 2 + 2 (the 16-bit weight and
    TE's cached FP8 copies); the distributed optimizer's parameter all-gather moves 1 byte, not 2. Gradients,
    the fp32 optimizer state and the activations do not move; BF16 plans are untouched."""
    from meshplan.cost_model.footprint import ALLOCATOR_FRACTION

    cfg = zoo.config("llama3-8b")
    cluster = Cluster.preset("h100-sxm", nodes=2)
    plan = make_plan(cfg, cluster, global_batch=64, seq_len=4096, tp=2, dp=8, zero=1, sp=True, dtype="float8")
    recipes = software_named("megatron-core-perf-recipes")
    assert recipes.fp8_param_gather and software_named("megatron-core-2024").fp8_param_gather
    assert not DEFAULT_SOFTWARE.fp8_param_gather
    cached = dataclasses.replace(recipes, name="recipes-without-fp8-params", fp8_param_gather=False)
    graph = make_graph(cfg)
    fp8w, bf16w = (estimate(graph, cluster, plan, software=s) for s in (recipes, cached))
    params = bf16w.memory_bytes["params"] / 2  # parameters on one GPU (2 bytes each in bf16)
    assert fp8w.memory_bytes["params"] == pytest.approx(params)
    assert all(fp8w.memory_bytes[k] == bf16w.memory_bytes[k] for k in ("grads", "optimizer", "activations"))
    # the weight at rest, 2 bytes a parameter -> 1, takes no allocator allowance (allocated once, updated in place);
    # the cached FP8 copies, 2 -> 1, a buffer, take theirs
    saved = bf16w.peak_memory_bytes - fp8w.peak_memory_bytes
    assert saved == pytest.approx(params + params * (1 + ALLOCATOR_FRACTION))
    assert fp8w.comm_bytes["dp"] < bf16w.comm_bytes["dp"]
    # BF16 plans, and ZeRO-3 ones (Megatron takes the flag with its distributed optimizer only), are untouched
    for other in (dataclasses.replace(plan, dtype="bfloat16"), dataclasses.replace(plan, zero_stage=3)):
        assert estimate(graph, cluster, other, software=recipes) == estimate(graph, cluster, other, software=cached)


def test_tp_splits_the_experts_only_where_the_program_does(make_graph, make_plan) -> None:
    """meshplan's runtime keeps the experts whole on every tp rank (codegen/tp_plans.py): TP shrinks neither
    their weights nor their FLOPs there. Megatron-Core splits them over tp (``Software.expert_tp``; the
    export passes --expert-tensor-parallel-size = tp): weights and expert GEMMs per rank halve at tp 2."""
    cfg = zoo.config("mixtral-8x7b")
    dims = make_graph(cfg).dims
    cluster = Cluster.preset("h100-sxm", nodes=2)
    megatron = software_named("megatron-core-2024")
    assert megatron.expert_tp and not DEFAULT_SOFTWARE.expert_tp

    def expert_flops(software: Software, tp: int) -> float:  # the experts' GEMMs, the layer's last two kinds
        shape = LayerShape(dims=dims, micro_batch=1, seq_len=4096, tp=tp, ep=4, sp=tp > 1, software=software)
        return sum(2 * m * n * k * count for m, n, k, count in layer_matmuls(shape)[-2:])

    assert expert_flops(megatron, 2) == pytest.approx(expert_flops(megatron, 1) / 2)
    assert expert_flops(DEFAULT_SOFTWARE, 2) == pytest.approx(expert_flops(DEFAULT_SOFTWARE, 1))

    def expert_param_bytes(software: Software, tp: int) -> float:
        plan = make_plan(cfg, cluster, global_batch=64, seq_len=4096, tp=tp, dp=16 // tp, ep=4, sp=tp > 1)
        return estimate(make_graph(cfg), cluster, plan, software=software).memory_bytes["params"]

    assert expert_param_bytes(megatron, 2) < 0.6 * expert_param_bytes(megatron, 1)
    assert expert_param_bytes(DEFAULT_SOFTWARE, 2) > 0.9 * expert_param_bytes(DEFAULT_SOFTWARE, 1)


def test_transformer_engines_cross_entropy_keeps_the_fp32_gradient_not_the_logits(make_graph, make_plan) -> None:
    """NVIDIA's perf recipes run Transformer Engine's fused loss (Software.cross_entropy "te"): its forward
    writes the fp32 gradient of the logits and keeps it (4 bytes a logit), and its backward's cast to bf16 is
    the only transient (2), where the upcast log-softmax keeps 4 and holds 8 more; its traffic is 8 bytes a
    logit forward (two reads of the 16-bit logits, the fp32 write) and 14 backward (the in-place scale, the
    cast), against 18 and 18."""
    from meshplan.cost_model.kernels import memory_time_s
    from meshplan.cost_model.layer_cost import edge_cost

    perf = software_named("megatron-core-perf-recipes")
    assert perf.cross_entropy == "te"
    upcast = dataclasses.replace(perf, name="perf-upcast-loss", cross_entropy="upcast")
    cfg = zoo.config("llama3-8b")
    cluster = Cluster.preset("h100-sxm", nodes=1)
    plan = make_plan(cfg, cluster, global_batch=16, seq_len=4096, dp=8, zero=1)
    te_mem = estimate(make_graph(cfg), cluster, plan, software=perf).memory_bytes
    up_mem = estimate(make_graph(cfg), cluster, plan, software=upcast).memory_bytes
    logits = plan.micro_batch_size * 4096 * cfg.vocab
    assert up_mem["activations"] - te_mem["activations"] == pytest.approx(logits * ((4 + 8) - (4 + 2)))
    dims = make_graph(cfg).dims
    cost = {sw.name: edge_cost(LayerShape(dims=dims, micro_batch=1, seq_len=4096, software=sw), cluster,
                               first=False, last=True) for sw in (perf, upcast)}
    accel, m = cluster.accelerator, 4096
    norm = 8 * m * cfg.hidden * 2
    saved_f = memory_time_s(accel, 18 * m * cfg.vocab + norm, 6) - memory_time_s(accel, 8 * m * cfg.vocab + norm, 6)
    saved_b = (memory_time_s(accel, 18 * m * cfg.vocab + 2 * norm, 8)
               - memory_time_s(accel, 14 * m * cfg.vocab + 2 * norm, 8))
    assert cost[upcast.name].fwd_compute_s - cost[perf.name].fwd_compute_s == pytest.approx(saved_f)
    assert cost[upcast.name].bwd_compute_s - cost[perf.name].bwd_compute_s == pytest.approx(saved_b)
    with pytest.raises(ir.PlanError, match="cross_entropy must be one of"):
        dataclasses.replace(perf, cross_entropy="fused")
    with pytest.raises(ir.PlanError, match="ep_dispatch must be one of"):
        dataclasses.replace(perf, ep_dispatch="deepep")


def test_expert_parallelism_folded_over_tp_keeps_experts_whole_and_routes_each_ranks_slice(make_graph,
                                                                                            make_plan) -> None:
    """ep over tp ranks (ir.Mesh.ep_over_tp, Megatron-Core's MoE folding with expert tensor parallelism 1):
    each rank holds ep-th of the experts whole, computes them on its own tp slice of the sequence (the same
    FLOPs as splitting them over tp), and dispatches that slice only; the experts' replicas are
    tp * dp / ep. Without sequence parallelism there is no slice to route: refused."""
    cfg = zoo.config("mixtral-8x7b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm", nodes=1)
    megatron = software_named("megatron-core-2024")
    folded = make_plan(cfg, cluster, global_batch=32, seq_len=4096, tp=2, dp=4, ep=8, sp=True, zero=1)
    inside = make_plan(cfg, cluster, global_batch=32, seq_len=4096, tp=2, dp=4, ep=4, sp=True, zero=1)
    assert folded.mesh.ep_over_tp and not inside.mesh.ep_over_tp
    assert (folded.mesh.expert_replicas, inside.mesh.expert_replicas) == (1, 1)
    dims = graph.dims

    def shape(mesh):
        return LayerShape(dims=dims, micro_batch=1, seq_len=4096, tp=mesh.tp, ep=mesh.ep, ep_over_tp=mesh.ep_over_tp,
                          sp=True, software=megatron)

    def expert_flops(mesh):
        return sum(2 * m * n * k * c for m, n, k, c in layer_matmuls(shape(mesh))[-2:])

    assert expert_flops(folded.mesh) == pytest.approx(expert_flops(inside.mesh))  # 1/tp of the work either way
    f_cost, i_cost = layer_cost(shape(folded.mesh), cluster), layer_cost(shape(inside.mesh), cluster)
    assert f_cost.comm_bytes_fwd["ep"] < i_cost.comm_bytes_fwd["ep"]  # each tp rank sends its slice only
    f_mem = estimate(graph, cluster, folded, software=megatron).memory_bytes
    i_mem = estimate(graph, cluster, inside, software=megatron).memory_bytes
    # 8 experts over ep 8, whole (1 expert) against 8 over ep 4 split over tp 2 (half of 2 experts): equal
    assert f_mem["params"] == pytest.approx(i_mem["params"], rel=1e-6)
    with pytest.raises(ir.InvalidPlanError, match="needs sequence_parallel"):
        estimate(graph, cluster, dataclasses.replace(folded, sequence_parallel=False), software=megatron)
    with pytest.raises(ir.InvalidPlanError, match=r"ep\(16\) must divide tp\(2\) \* dp\(4\) \* cp\(1\) = 8"):
        ir.Mesh(tp=2, dp=4, ep=16)


def test_megatrons_a2a_overlap_hides_the_expert_all_to_alls_under_the_paired_compute(make_graph, make_plan) -> None:
    """Software.ep_comm_overlap (Megatron's 1F1B A2A overlap): a layer's forward dispatch and combine run under the
    paired micro-batch's backward compute, and its backward ones under the forward's; only what exceeds it waits,
    and what hides slows compute by overlap_slowdown. The estimate applies it only where Megatron does:
    expert parallelism, no full recomputation, virtual stages under pipelining."""
    cfg = zoo.config("mixtral-8x7b")
    h100 = Cluster.preset("h100-sxm", nodes=4)  # without the launch-order rule of Hopper's TP overlap (next test)
    graph, cluster = make_graph(cfg), dataclasses.replace(
        h100, accelerator=dataclasses.replace(h100.accelerator, ordered_comm_overlap=False))
    perf = software_named("megatron-core-perf-recipes")
    overlapped = dataclasses.replace(perf, ep_comm_overlap=True)
    base = LayerShape(dims=graph.dims, micro_batch=1, seq_len=4096, tp=2, ep=8, sp=True, software=perf)
    plain, over = layer_cost(base, cluster), layer_cost(dataclasses.replace(base, ep_overlap=True), cluster)
    ep_each = collective_time("all-to-all", 4096 * graph.dims.hidden * 2 * graph.dims.top_k, 8, 2, cluster)
    tp_part = plain.fwd_comm_s - 2 * ep_each  # the TP and its slowdown, unchanged by the EP overlap
    # the forward's two all-to-alls under the backward's compute, the backward's under the forward's
    exposed = max(0.0, 2 * ep_each - plain.bwd_compute_s) + max(0.0, 2 * ep_each - plain.fwd_compute_s)
    hidden = 4 * ep_each - exposed
    assert over.fwd_comm_s == pytest.approx(tp_part + exposed / 2 + perf.overlap_slowdown * hidden / 2, rel=1e-9)
    assert over.fwd_comm_s < plain.fwd_comm_s and over.bwd_comm_s < plain.bwd_comm_s

    def step(software, **kw):
        plan = make_plan(cfg, cluster, global_batch=64, seq_len=4096, tp=2, ep=8, sp=True, zero=1, **{"dp": 16, **kw})
        return estimate(graph, cluster, plan, software=software).step_time_s

    assert step(overlapped) < step(perf)  # pp 1
    assert step(overlapped, pp=2, dp=8, vp=2, schedule="interleaved-1f1b") < step(perf, pp=2, dp=8, vp=2,
                                                                                  schedule="interleaved-1f1b")
    # Megatron refuses the overlap under pipelining without virtual stages, and beside full recomputation
    assert step(overlapped, pp=2, dp=8) == step(perf, pp=2, dp=8)
    assert step(overlapped, recompute="full") == step(perf, recompute="full")


def test_before_blackwell_the_a2a_overlap_gives_up_the_tp_comm_overlap(make_graph) -> None:
    """Accelerator.ordered_comm_overlap: on Hopper and Ampere, Transformer Engine's TP comm-GEMM overlap needs
    CUDA_DEVICE_MAX_CONNECTIONS=1, which NVIDIA's scripts give up for Megatron's 1F1B A2A overlap; so beside it the
    sequence-parallel collectives wait as if no overlap were set, and so does the CP exchange, while without it, or
    on Blackwell, they hide."""
    graph = make_graph(zoo.config("mixtral-8x7b"))
    h100, gb200 = Cluster.preset("h100-sxm", nodes=4), Cluster.preset("gb200-nvl72")
    free = dataclasses.replace(h100, accelerator=dataclasses.replace(h100.accelerator, ordered_comm_overlap=False))
    perf = software_named("megatron-core-perf-recipes")
    base = LayerShape(dims=graph.dims, micro_batch=1, seq_len=4096, tp=2, ep=8, sp=True, software=perf,
                      ep_overlap=True)
    ordered, unordered = layer_cost(base, h100), layer_cost(base, free)
    waits = layer_cost(dataclasses.replace(base, software=dataclasses.replace(perf, tp_comm_overlap=False)), free)
    assert (ordered.fwd_comm_s, ordered.bwd_comm_s) == pytest.approx((waits.fwd_comm_s, waits.bwd_comm_s), rel=1e-12)
    assert ordered.fwd_comm_s > unordered.fwd_comm_s and ordered.bwd_comm_s > unordered.bwd_comm_s
    plain = dataclasses.replace(base, ep_overlap=False)  # no A2A overlap: one hardware queue, the TP overlap stays
    assert layer_cost(plain, h100).fwd_comm_s == pytest.approx(layer_cost(plain, free).fwd_comm_s, rel=1e-12)
    assert layer_cost(base, gb200).fwd_comm_s < layer_cost(
        dataclasses.replace(base, software=dataclasses.replace(perf, tp_comm_overlap=False)), gb200).fwd_comm_s
    assert [Cluster.preset(n).accelerator.ordered_comm_overlap
            for n in ("a100-80gb", "a100-40gb", "h100-sxm", "h200", "b200", "gb200-nvl72", "mi300x")] == [
        True, True, True, True, False, False, False]
    # context parallelism's K/V exchange (tp 1: no TP traffic), which hides under the attention core, waits beside
    # the A2A overlap too, and only there
    ring = dataclasses.replace(base, tp=1, sp=False, cp=4, seq_len=32768)
    assert layer_cost(ring, h100).fwd_comm_s > layer_cost(ring, free).fwd_comm_s
    assert layer_cost(ring, h100).bwd_comm_s > layer_cost(ring, free).bwd_comm_s
    no_a2a_overlap = dataclasses.replace(ring, ep_overlap=False)
    assert layer_cost(no_a2a_overlap, h100).fwd_comm_s == pytest.approx(layer_cost(no_a2a_overlap, free).fwd_comm_s,
                                                                        rel=1e-12)


def test_transformer_engine_s_cudnn_attention_runs_the_core_at_its_benchmarked_rate() -> None:
    """The Megatron-Core perf recipes run cuDNN's fused attention (Software.attention_kernel "cudnn"): on an
    H100 a Llama-3 70B layer's core at 8k tokens runs at cuDNN's benchmarked rate (0.651 of peak forward, a
    backward 2.98 forwards), about twice FlashAttention-2's (0.311, 2.5), and nothing else in the layer changes;
    NeMo's 2024 scripts keep FA2's rate; an unknown kernel is refused by name."""
    h100 = Cluster.preset("h100-sxm")
    llama70 = ir.ModelDims(family="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256)
    recipes, nemo = software_named("megatron-core-perf-recipes"), software_named("nemo-perf-recipes-2024")
    assert (recipes.attention_kernel, nemo.attention_kernel) == ("cudnn", "fa2")
    shape = LayerShape(dims=llama70, micro_batch=1, seq_len=8192, tp=4, sp=True, software=recipes)
    cudnn, fa2 = layer_cost(shape, h100), layer_cost(dataclasses.replace(shape, software=nemo), h100)
    overhead = h100.accelerator.kernel_overhead_s
    assert (fa2.core_fwd_s - overhead) / (cudnn.core_fwd_s - overhead) == pytest.approx(0.651 / 0.311, rel=1e-3)
    assert fa2.fwd_compute_s - fa2.core_fwd_s == pytest.approx(cudnn.fwd_compute_s - cudnn.core_fwd_s)
    with pytest.raises(ir.PlanError, match="attention_kernel must be one of"):
        Software(name="bad", attention_kernel="flash3")


def test_current_scaling_reads_each_fp8_operand_twice() -> None:
    """Transformer Engine's current scaling (Megatron ``--fp8-recipe tensorwise``, the perf recipes' "FP8") takes each
    tensor's amax in a pass of its own before the cast ("two tensor reads per quantization", TE docs): 6 bytes an
    element and twice the kernels, where delayed scaling and MXFP8 move 4; a recipe TE lacks is refused."""
    from meshplan.cost_model.layer_cost import fp8_cast_bytes

    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    recipes = software_named("megatron-core-perf-recipes")
    assert recipes.fp8_recipe == "tensorwise" and software_named("nemo-perf-recipes-2024").fp8_recipe == "delayed"
    shape = LayerShape(dims=llama, micro_batch=2, seq_len=4096, dtype="float8", software=recipes)
    current = fp8_cast_bytes(shape)
    delayed, mx = (fp8_cast_bytes(dataclasses.replace(shape, software=dataclasses.replace(recipes, fp8_recipe=r)))
                   for r in ("delayed", "mxfp8"))
    assert delayed == mx and current == (1.5 * delayed[0], 8, 1.5 * delayed[2], 8) and delayed[1] == 4
    with pytest.raises(ir.PlanError, match="fp8_recipe must be one of"):
        Software(name="bad", fp8_recipe="nvfp4")


def test_nvfp4_runs_the_layer_gemms_at_the_fp4_rate_casts_twice_and_leaves_the_output_layer_in_bf16() -> None:
    """A float4 plan (Megatron ``--fp4-format e2m1``, Transformer Engine's NVFP4BlockScaling) runs a layer's GEMMs
    at the FP4 peak (on a GB200 twice FP8's at the same assumed fraction: half the time at compute-bound shapes),
    casts each operand with an amax pass and two 0.5 + 1/16-byte copies (4 + 1.125 bytes an element, where FP8's
    delayed scaling moves 4), and keeps the output layer's GEMM in bf16 as FP8 plans do (Megatron-Core's output
    layer is not a Transformer Engine module); an accelerator without an FP4 rate refuses the dtype by name."""
    from meshplan.cost_model.layer_cost import edge_cost, fp8_cast_bytes, matmul_s
    from meshplan.cost_model.memory import GEMM_OPERAND_BYTES

    gb200 = Cluster.preset("gb200-nvl72")
    accel = gb200.accelerator
    assert accel.achievable_flops("float4") == pytest.approx(2 * accel.achievable_flops("float8"))
    llama70 = ir.ModelDims(family="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256)
    recipes = software_named("megatron-core-perf-recipes")
    fp8 = LayerShape(dims=llama70, micro_batch=2, seq_len=8192, dtype="float8",
                     software=dataclasses.replace(recipes, fp8_recipe="delayed"))
    fp4 = dataclasses.replace(fp8, dtype="float4")
    overhead = len(layer_matmuls(fp8)) * accel.kernel_overhead_s  # one launch per GEMM, as many forward
    assert (matmul_s(fp4, gb200)[0] - overhead) / (matmul_s(fp8, gb200)[0] - overhead) == pytest.approx(0.5, rel=0.02)
    assert GEMM_OPERAND_BYTES["float4"] == 0.5625
    f4, f8 = fp8_cast_bytes(fp4), fp8_cast_bytes(fp8)
    assert (f4[0] / f8[0], f4[2] / f8[2], f4[1], f8[1]) == (pytest.approx(5.125 / 4), pytest.approx(5.125 / 4), 8, 4)
    assert fp8_cast_bytes(dataclasses.replace(fp8, dtype="bfloat16")) == (0.0, 0, 0.0, 0)
    heads = [edge_cost(s, gb200, first=False, last=True) for s in (fp4, fp8, dataclasses.replace(fp8, dtype="bfloat16"))]
    assert heads[0].fwd_compute_s == pytest.approx(heads[1].fwd_compute_s) == pytest.approx(heads[2].fwd_compute_s)
    with pytest.raises(ir.InvalidClusterError, match="has no float4 peak"):
        matmul_s(fp4, Cluster.preset("h100-sxm"))


def test_nvfp4_runs_tensor_parallel_communication_exposed_as_nvidias_recipes_do() -> None:
    """The perf recipes overlap TP's all-gathers and reduce-scatters with the GEMMs (--tp-comm-overlap), except
    under NVFP4, where Megatron-Bridge's configs turn it off: a tp 4 layer exposes its TP communication in
    float4 and hides it in float8."""
    gb200 = Cluster.preset("gb200-nvl72")
    recipes = software_named("megatron-core-perf-recipes")
    assert recipes.overlaps_tp_comm("float8") and not recipes.overlaps_tp_comm("float4")
    llama405 = ir.ModelDims(family="llama", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248,
                            vocab=128256)
    fp8 = LayerShape(dims=llama405, micro_batch=1, seq_len=8192, tp=4, sp=True, dtype="float8", software=recipes)
    hidden, exposed = layer_cost(fp8, gb200), layer_cost(dataclasses.replace(fp8, dtype="float4"), gb200)
    assert exposed.fwd_comm_s > 3 * hidden.fwd_comm_s and exposed.bwd_comm_s > 3 * hidden.bwd_comm_s


def test_a_moe_router_runs_in_bf16_under_fp8() -> None:
    """Megatron-Core's router GEMM (``router_gating_linear``) is not a Transformer Engine module: in a float8 plan
    it is timed at the bf16 rate, the layer's other GEMMs at the FP8 rate."""
    from meshplan.cost_model.kernels import matmul_fwd_bwd_s
    from meshplan.cost_model.layer_cost import ROUTER, matmul_s

    h100 = Cluster.preset("h100-sxm")
    qwen = ir.ModelDims(family="moe", layers=48, hidden=2048, heads=32, kv_heads=4, ffn_hidden=768, vocab=151936,
                        experts=128, top_k=8, head_dim=128)
    shape = LayerShape(dims=qwen, micro_batch=1, seq_len=4096, ep=8, dtype="float8",
                       software=software_named("megatron-core-perf-recipes"))
    mms = layer_matmuls(shape)
    assert mms[ROUTER][1] == qwen.experts

    def timed(i: int, dtype: str) -> float:
        m, n, k, count = mms[i]
        return count * matmul_fwd_bwd_s(h100.accelerator, dtype, m, n, k, 2)[0]

    expected = sum(timed(i, "bfloat16" if i == ROUTER else "float8") for i in range(len(mms)))
    assert matmul_s(shape, h100)[0] == pytest.approx(expected)
    assert timed(ROUTER, "bfloat16") > 1.5 * timed(ROUTER, "float8")


def test_a_fused_grouped_mlp_moves_no_expert_activation_and_casts_nothing_between_the_expert_gemms() -> None:
    """Megatron-Bridge's ``cutedsl_fused_grouped_mlp`` runs the experts' SwiGLU in the first grouped GEMM's epilogue,
    which writes the MXFP8 copies the second GEMM reads (``Software.fused_grouped_mlp``): the layer moves the
    activation's 5 passes over the k routed copies' FFN width less, forward and twice that backward, and casts
    neither the fc2 input nor the fc1 output gradient; attention, norms and the dispatch are unchanged."""
    from meshplan.cost_model.layer_cost import elementwise_fwd, fp8_cast_bytes

    gb300 = Cluster.preset("gb300-nvl72")
    qwen = ir.ModelDims(family="moe", layers=48, hidden=2048, heads=32, kv_heads=4, ffn_hidden=768, vocab=151936,
                        experts=128, top_k=8, head_dim=128)
    mx = dataclasses.replace(software_named("megatron-core-perf-recipes"), fp8_recipe="mxfp8")
    plain = LayerShape(dims=qwen, micro_batch=8, seq_len=4096, ep=8, dtype="float8", software=mx)
    fused = dataclasses.replace(plain, software=dataclasses.replace(mx, fused_grouped_mlp=True))
    f = 8 * 4096 * qwen.top_k * qwen.ffn_hidden  # elements of the experts' activation output on this rank
    (moved, kernels), (fused_moved, fused_kernels) = elementwise_fwd(plain), elementwise_fwd(fused)
    assert moved - fused_moved == pytest.approx(5 * f * 2)  # silu (r+w) and product (2r+w) in bf16
    assert fused_kernels == kernels
    cast_f, _, cast_b, _ = fp8_cast_bytes(plain)
    fused_cast_f, _, fused_cast_b, _ = fp8_cast_bytes(fused)
    assert cast_f - fused_cast_f == pytest.approx(4 * f)  # MXFP8: read 2 bytes, write 2 an element
    assert cast_b - fused_cast_b == pytest.approx(4 * 2 * f)  # the gate and up gradients
    slow, fast = layer_cost(plain, gb300), layer_cost(fused, gb300)
    assert fast.fwd_compute_s < slow.fwd_compute_s and fast.bwd_compute_s < slow.bwd_compute_s
    assert fast.core_fwd_s == slow.core_fwd_s
    # a dense layer has no grouped GEMM to fuse
    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    dense = LayerShape(dims=llama, micro_batch=1, seq_len=8192, dtype="float8", software=mx)
    assert elementwise_fwd(dense) == elementwise_fwd(dataclasses.replace(dense, software=fused.software))
    assert fp8_cast_bytes(dense) == fp8_cast_bytes(dataclasses.replace(dense, software=fused.software))


def test_recomputed_modules_pay_their_forward_again_in_the_backward() -> None:
    """Megatron's ``--recompute-modules layernorm moe_act`` (``Software.recompute_modules``): the backward reads and
    writes the two norms again (2 passes each over the layer's (m, h) activation) and redoes the experts'
    activation; the forward is unchanged, and a module Megatron has but the model does not cost is refused."""
    from meshplan.cost_model.kernels import memory_time_s
    from meshplan.cost_model.layer_cost import recompute_modules_bytes

    gb200 = Cluster.preset("gb200-nvl72")
    oss = ir.ModelDims(family="moe", layers=36, hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880, vocab=201088,
                       experts=128, top_k=4, head_dim=64)
    recipes = software_named("megatron-core-perf-recipes")
    plain = LayerShape(dims=oss, micro_batch=4, seq_len=4096, ep=64, dtype="bfloat16", software=recipes)
    both = dataclasses.replace(plain, software=dataclasses.replace(recipes, recompute_modules=("layernorm", "moe_act")))
    m = 4 * 4096
    moved, kernels = recompute_modules_bytes(both)
    assert moved == pytest.approx(2 * 2 * m * oss.hidden * 2 + 5 * oss.top_k * m * oss.ffn_hidden * 2)
    assert kernels == 3 and recompute_modules_bytes(plain) == (0.0, 0)
    base, again = layer_cost(plain, gb200), layer_cost(both, gb200)
    assert again.fwd_compute_s == base.fwd_compute_s
    assert again.bwd_compute_s - base.bwd_compute_s == pytest.approx(memory_time_s(gb200.accelerator, moved, kernels))
    # a fused grouped MLP has no separate activation to recompute
    fused = dataclasses.replace(both.software, fused_grouped_mlp=True)
    assert recompute_modules_bytes(dataclasses.replace(both, software=fused))[0] == pytest.approx(2 * 2 * m * oss.hidden * 2)
    with pytest.raises(ir.PlanError, match="recompute_modules"):
        dataclasses.replace(recipes, recompute_modules=("mla_up_proj",))


def test_a_clamped_glu_and_biased_experts_move_what_megatron_core_runs_eagerly() -> None:
    """GPT-OSS's experts (``ModelDims.glu_limit``, ``expert_bias``) under Megatron-Core's TEGroupedMLP: the clamp
    moves 8 (routed tokens, ffn) passes forward and 10 backward, fc2's bias added in fp32 28 bytes a routed output
    element forward and 36 backward (``layer_cost.expert_extra_bytes``); both recomputed with ``moe_act``; none
    where the grouped GEMM fuses them or torch.compile does."""
    from meshplan.cost_model.kernels import memory_time_s
    from meshplan.cost_model.layer_cost import expert_extra_bytes, recompute_modules_bytes

    gb200 = Cluster.preset("gb200-nvl72")
    plain = ir.ModelDims(family="moe", layers=36, hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880, vocab=201088,
                         experts=128, top_k=4, head_dim=64)
    oss = dataclasses.replace(plain, expert_bias=True, glu_limit=7.0)
    recipes = software_named("megatron-core-perf-recipes")
    shape = LayerShape(dims=oss, micro_batch=4, seq_len=4096, ep=64, dtype="bfloat16", software=recipes)
    routed = 4 * 4 * 4096  # top-k copies of the micro-batch's tokens
    u, r = routed * 2880 * 2, routed * 2880
    assert expert_extra_bytes(shape) == (pytest.approx(8 * u + 28 * r), 3 + 2 * 2 + 2,
                                         pytest.approx(10 * u + 36 * r), 3 + 4 * 2 + 2)
    base = dataclasses.replace(shape, dims=plain)
    assert expert_extra_bytes(base) == (0.0, 0, 0.0, 0)
    fwd, fk, bwd, bk = expert_extra_bytes(shape)
    slow, fast = layer_cost(shape, gb200), layer_cost(base, gb200)
    assert slow.fwd_compute_s - fast.fwd_compute_s == pytest.approx(memory_time_s(gb200.accelerator, fwd, fk))
    assert slow.bwd_compute_s > fast.bwd_compute_s
    for software in (dataclasses.replace(recipes, fused_grouped_mlp=True), dataclasses.replace(recipes, compiled=True)):
        assert expert_extra_bytes(dataclasses.replace(shape, software=software)) == (0.0, 0, 0.0, 0)
    act = dataclasses.replace(recipes, recompute_modules=("moe_act",))
    again = recompute_modules_bytes(dataclasses.replace(shape, software=act))
    assert again == (pytest.approx(5 * u + 8 * u), 1 + 3)
    assert recompute_modules_bytes(dataclasses.replace(base, software=act)) == (pytest.approx(5 * u), 1)


def test_a_software_name_adds_its_modifiers_to_its_preset() -> None:
    """``preset+modifier+...`` names the preset with the fields each modifier sets (``software.MODIFIERS``), as a
    plan file keeps it and ``--software`` takes it; unknown modifiers, misordered modules and modifiers on
    meshplan's own runtime are refused, each naming what is known."""
    from meshplan.ir import PlanError

    base = software_named("megatron-core-perf-recipes")
    named = software_named("megatron-core-perf-recipes+mxfp8+ep-overlap+fused-mlp+expandable+recompute-layernorm-moe_act")
    assert named.name.startswith("megatron-core-perf-recipes+") and named.search_space == base.search_space
    assert (named.fp8_recipe, named.ep_comm_overlap, named.fused_grouped_mlp, named.expandable_segments,
            named.recompute_modules) == ("mxfp8", True, True, True, ("layernorm", "moe_act"))
    assert (base.fp8_recipe, base.ep_comm_overlap, base.fused_grouped_mlp, base.expandable_segments,
            base.recompute_modules) == ("tensorwise", False, False, False, ())
    assert software_named("megatron-core-perf-recipes") is base
    for bad, says in (("megatron-core-perf-recipes+fast", "unknown modifier 'fast'; known: mxfp8"),
                      ("megatron-core-perf-recipes+recompute-moe_act-layernorm", "in that order"),
                      ("meshplan+expandable", "no modifiers"), ("megatron+mxfp8", "unknown software 'megatron'")):
        with pytest.raises(PlanError, match=says):
            software_named(bad)


def test_llm_foundry_s_flash_path_pays_its_unpad_gathers_and_pad_scatters() -> None:
    """``Software.attention_unpad`` (llm-foundry's ``flash_attn_fn``: bert_padding's unpad_input on q, k, v and
    pad_input on the output): 5 q-sized and 4 kv-sized passes forward in 9 kernels, 5 and 6 backward in 7, each priced
    at the memory-bound rate on top of the layer's own; its preset ``llm-foundry-2024`` runs it, the Triton-kernel
    program of 2023 does not, and a program without it pays nothing."""
    import importlib

    from meshplan.cost_model.kernels import memory_time_s

    lc = importlib.import_module("meshplan.cost_model.layer_cost")
    gqa = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    b, s = 2, 4096
    off = software_named("llm-foundry-2024")
    assert off.attention_unpad and not software_named("llm-foundry-2023").attention_unpad
    assert not software_named("megatron-core-perf-recipes").attention_unpad
    off = dataclasses.replace(off, attention_unpad=False)
    on = dataclasses.replace(off, attention_unpad=True)
    shape_on, shape_off = (lc.LayerShape(dims=gqa, micro_batch=b, seq_len=s, software=sw) for sw in (on, off))
    q, kv = b * s * 4096 * 2, b * s * 1024 * 2
    assert lc.unpad_bytes(shape_on) == pytest.approx((5 * q + 4 * kv, 9, 5 * q + 6 * kv, 7))
    assert lc.unpad_bytes(shape_off) == (0.0, 0, 0.0, 0)
    accel = Cluster.preset("h100-sxm").accelerator
    paid, free = (lc.layer_cost(sh, Cluster.preset("h100-sxm")) for sh in (shape_on, shape_off))
    assert paid.fwd_compute_s - free.fwd_compute_s == pytest.approx(memory_time_s(accel, 5 * q + 4 * kv, 9))
    assert paid.bwd_compute_s - free.bwd_compute_s == pytest.approx(memory_time_s(accel, 5 * q + 6 * kv, 7))


def test_a_window_aware_kernel_runs_the_windowed_layers_share_of_the_causal_attention() -> None:
    """``flops.window_share``: a layer whose queries read w keys back executes s w - w^2 / 2 of the s^2 / 2 causal
    pairs; with half the layers windowed the mean is 1/2 + 1/2 (2 w / s - (w / s)^2), and 1 once the window spans the
    sequence. Megatron-Core's programs (window_size to Transformer Engine) price the attention core at that share;
    meshplan's runtime (a mask over the whole sequence) and the unfused kernel at the full causal work."""
    import importlib

    from meshplan.cost_model.flops import window_share

    lc = importlib.import_module("meshplan.cost_model.layer_cost")
    oss = ir.ModelDims(family="moe", layers=36, hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880, vocab=201088,
                       experts=128, top_k=4, head_dim=64, attention_window=128, windowed_layers=18)
    w, s = 128, 4096
    assert window_share(oss, s) == pytest.approx(0.5 + 0.5 * (2 * w / s - (w / s) ** 2))
    assert window_share(oss, 128) == 1.0 and window_share(dataclasses.replace(oss, windowed_layers=0), s) == 1.0
    megatron = software_named("megatron-core-perf-recipes")
    assert megatron.window_kernel and not software_named("meshplan").window_kernel
    cluster = Cluster.preset("h100-sxm")
    full = dataclasses.replace(oss, attention_window=0, windowed_layers=0)
    for sw, share in ((megatron, window_share(oss, s)), (software_named("meshplan"), 1.0)):
        windowed, plain = (lc.core_s(lc.LayerShape(dims=d, micro_batch=2, seq_len=s, software=sw), cluster)
                           for d in (oss, full))
        kernel_s = cluster.accelerator.kernel_overhead_s  # each pass's fixed cost does not shrink
        assert windowed[0] - kernel_s == pytest.approx((plain[0] - kernel_s) * share)


def test_torch_compile_fuses_each_pointwise_chain_between_gemms_into_one_kernel() -> None:
    """``Software.compiled`` (``+compile``: torchtitan's per-block torch.compile): a Llama block's forward moves the
    attention norm (r+w), rotary with the grouped-query repeat (q r+w, k and v read at kv width and written at q's),
    the attention output's copy, the residual add fused with the MLP norm (2r+2w), SwiGLU (2r+w) and the last add
    (2r+w) in 6 kernels, against the eager chains' 35; the backward twice that, as for every program; and the
    activations it keeps lose nn.RMSNorm's fp32 tensors and SwiGLU's silu output (recomputed)."""
    import importlib

    from meshplan.cost_model.memory import eager_layer_bytes

    lc = importlib.import_module("meshplan.cost_model.layer_cost")
    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    b, s = 2, 8192
    eager, compiled = software_named("torchtitan"), software_named("torchtitan+compile")
    assert compiled.compiled and not eager.compiled and compiled.name == "torchtitan+compile"
    whole, q, kv, f = (b * s * w * 2 for w in (4096, 4096, 1024, 14336))
    moved, kernels = lc.elementwise_fwd(LayerShape(dims=llama, micro_batch=b, seq_len=s, software=compiled))
    assert moved == pytest.approx(9 * whole + 2 * q + (2 * q + 2 * kv + 2 * q) + 3 * f) and kernels == 6
    plain = lc.elementwise_fwd(LayerShape(dims=llama, micro_batch=b, seq_len=s, software=eager))
    assert plain[0] > 1.5 * moved and plain[1] == 35
    h100 = Cluster.preset("h100-sxm")
    fast, slow = (layer_cost(LayerShape(dims=llama, micro_batch=b, seq_len=s, software=sw), h100)
                  for sw in (compiled, eager))
    assert fast.fwd_compute_s < slow.fwd_compute_s and fast.bwd_compute_s < slow.bwd_compute_s
    kept = {c: eager_layer_bytes(llama, seq_len=s, micro_batch=b, compiled=c) for c in (False, True)}
    norms = eager_layer_bytes(llama, seq_len=s, micro_batch=b) - eager_layer_bytes(llama, seq_len=s, micro_batch=b,
                                                                                   fused_norm=True)
    assert kept[False] - kept[True] == pytest.approx(norms + s * b * 14336 * 2)
    # GPT: no rotary, LayerNorms and GELU in 5 kernels
    gpt = ir.ModelDims(family="gpt", layers=24, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=50257)
    g_moved, g_kernels = lc.elementwise_fwd(LayerShape(dims=gpt, micro_batch=1, seq_len=2048, software=compiled))
    w, f = 2048 * 2048 * 2, 2048 * 8192 * 2
    assert g_moved == pytest.approx(9 * w + 2 * w + 2 * f) and g_kernels == 5


def test_float8_is_torchaos_tensorwise_scaling_on_the_layer_gemms() -> None:
    """``+float8`` (torchao's Float8Linear, torchtitan's ``float8`` converter): the tensorwise dynamic scaling of
    each GEMM operand, priced as current scaling (6 bytes an element, an amax pass before each cast); a float8 plan
    under it runs the block GEMMs at the FP8 rate and leaves the output layer in bf16."""
    from meshplan.cost_model.layer_cost import fp8_cast_bytes, matmul_s

    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    fp8 = software_named("torchtitan+compile+float8")
    assert fp8.fp8_recipe == "tensorwise" and fp8.compiled and software_named("torchtitan").fp8_recipe == "tensorwise"
    shape = LayerShape(dims=llama, micro_batch=2, seq_len=8192, dtype="float8", software=fp8)
    te = LayerShape(dims=llama, micro_batch=2, seq_len=8192, dtype="float8",
                    software=software_named("megatron-core-perf-recipes"))
    assert fp8_cast_bytes(shape) == fp8_cast_bytes(te)
    h100 = Cluster.preset("h100-sxm")
    bf16 = dataclasses.replace(shape, dtype="bfloat16")
    assert matmul_s(shape, h100)[0] < 0.75 * matmul_s(bf16, h100)[0]


def test_blackwells_exponentials_bound_a_head_dim_64_forward_and_a_short_window_runs_at_its_measured_rate() -> None:
    """``Accelerator.softmax_bound``: a (query, key) pair costs 4 x head dim matmul FLOPs and one exponential, so at
    8192 dense BF16 FLOPs per 16 exponentials (Blackwell: R 512) head dim 64 halves the forward's measured (head dim
    128) rate and leaves the backward's time; Hopper and Blackwell Ultra (R 256) keep it, and so do MLA's heads, whose
    pair costs 2 x 192 + 2 x 128. ``Accelerator.cudnn_window_attention``: the windowed layers of GPT-OSS (128 back,
    head dim 64) run at the rate cuDNN's benchmark measured on GB200, 161 TFLOP/s forward, not at the full kernel's on
    their share of the pairs; a window it did not measure stays on that share."""
    import importlib

    from meshplan.cost_model.flops import attention_core_flops, window_pair_share
    from meshplan.cost_model.kernels import attention_fwd_bwd_s

    lc = importlib.import_module("meshplan.cost_model.layer_cost")
    gb200, gb300, h100 = (Cluster.preset(n).accelerator for n in ("gb200-nvl72", "gb300-nvl72", "h100-sxm"))
    assert (gb200.flops_per_exp, gb300.flops_per_exp, h100.flops_per_exp) == (512, 256, 256)
    assert gb200.softmax_bound(64) == 0.5 and gb200.softmax_bound(128) == gb200.softmax_bound(160) == 1.0
    assert gb300.softmax_bound(64) == h100.softmax_bound(64) == 1.0 and Cluster.preset("a100-80gb").accelerator \
        .softmax_bound(64) == 1.0  # no rate published: no bound
    flops = 4.0 * 4 * 4096**2 * 4096
    f64, b64 = attention_fwd_bwd_s(gb200, "bfloat16", flops, head_dim=64, seq_len=4096, kernel="cudnn")
    f128, b128 = attention_fwd_bwd_s(gb200, "bfloat16", flops, head_dim=128, seq_len=4096, kernel="cudnn")
    mla = attention_fwd_bwd_s(gb200, "bfloat16", flops, head_dim=64, seq_len=4096, kernel="cudnn", pair_dim=160)
    kernel_s = gb200.kernel_overhead_s
    assert f64 - kernel_s == pytest.approx(2 * (f128 - kernel_s))
    assert b64 == pytest.approx(b128 / f128 * 0.5 * f64) and b64 == pytest.approx(b128, rel=1e-2)  # the same backward
    assert mla == pytest.approx((f128, b128))
    oss = ir.ModelDims(family="moe", layers=36, hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880, vocab=201088,
                       experts=128, top_k=4, head_dim=64, attention_window=128, windowed_layers=18)
    megatron = software_named("megatron-core-perf-recipes")
    shape = lc.LayerShape(dims=oss, micro_batch=4, seq_len=4096, software=megatron)
    full = attention_core_flops(oss, 4, 4096)
    half_f, half_b = attention_fwd_bwd_s(gb200, "bfloat16", full * 0.5, head_dim=64, seq_len=4096, kernel="cudnn",
                                         pair_dim=64)
    window_f = 0.5 * full * 0.5 * window_pair_share(128, 4096) / (2500e12 * 0.0644) + kernel_s
    got = lc.core_s(shape, Cluster.preset("gb200-nvl72"))
    assert got == pytest.approx((half_f + window_f, half_b + 2.214 * window_f))
    # H100's measured window is cuDNN's at 1024 (H200's benchmark): GPT-OSS's 128 stays at the full kernel's rate
    h100_cluster = Cluster.preset("h100-sxm")
    expected = attention_fwd_bwd_s(h100, "bfloat16", full * lc.window_share(oss, 4096), head_dim=64, seq_len=4096,
                                   kernel="cudnn", pair_dim=64)
    assert lc.core_s(shape, h100_cluster) == pytest.approx(expected)


def test_megatron_fsdp_reduces_gradients_in_the_models_dtype_where_the_distributed_optimizer_uses_fp32(
        make_graph, make_plan) -> None:
    """Software.reduces_grads_in_fp32: Megatron-LM accumulates and reduces bf16 gradients in fp32 under its
    distributed optimizer (megatron-core-2024's fp32_grad_reduce), but Megatron-FSDP, ZeRO-3 of a Megatron-Core
    program, keeps them in the model's dtype ("auto"): half the reduce-scatter's bytes of the fp32 count, and its
    gradient memory in bf16. meshplan's runtime reduces in fp32 at every ZeRO stage (codegen.precision)."""
    cfg = zoo.config("llama3-8b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm", nodes=2)
    mcore = software_named("megatron-core-2024")
    assert mcore.fp32_grad_reduce and mcore.reduces_grads_in_fp32(1) and not mcore.reduces_grads_in_fp32(3)
    assert DEFAULT_SOFTWARE.reduces_grads_in_fp32(3) and DEFAULT_SOFTWARE.reduces_grads_in_fp32(1)
    as_fp32 = dataclasses.replace(mcore, megatron_buckets=False)  # the same program, told to reduce in fp32
    assert as_fp32.reduces_grads_in_fp32(3)
    plan = make_plan(cfg, cluster, global_batch=16, seq_len=4096, tp=1, dp=16, zero=3, recompute="full")
    fsdp, fp32 = (estimate(graph, cluster, plan, software=s) for s in (mcore, as_fp32))
    # per micro-batch: gather forward and backward (2 bytes a parameter each), reduce-scatter (2 or 4 bytes)
    assert fp32.comm_bytes["dp"] / fsdp.comm_bytes["dp"] == pytest.approx((2 + 2 + 4) / (2 + 2 + 2), rel=1e-6)
