"""Model-state memory under ZeRO: the paper's known answers, and the estimate's use of them."""
from __future__ import annotations

import pytest

from meshplan.cost_model import Cluster, estimate, memory_breakdown, state_bytes
from meshplan.cost_model.software import Software

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
    from meshplan.cost_model.software import MEGATRON_CORE_2024

    # bf16 under Megatron: bf16 params and grads, fp32 master weights and Adam state (2, 2, 12)
    dp0 = memory_breakdown(graph, cluster, make_plan(cfg, cluster, global_batch=8, seq_len=1024, dp=8),
                           software=MEGATRON_CORE_2024)
    assert dp0["params"] == pytest.approx(2 * psi) and dp0["optimizer"] == pytest.approx(12 * psi)
    # meshplan's runtime keeps fp32 parameters as the master weights, bf16 only gathered (4, 4, 8)
    ours = memory_breakdown(graph, cluster, make_plan(cfg, cluster, global_batch=8, seq_len=1024, dp=8))
    assert ours["params"] == pytest.approx(4 * psi) and ours["optimizer"] == pytest.approx(8 * psi)
    # two micro-batches: the second backward holds the first one's gradients (_grads_at_peak)
    z3 = memory_breakdown(graph, cluster, make_plan(cfg, cluster, global_batch=16, seq_len=1024, dp=8, zero=3))
    assert z3["params"] == pytest.approx(4 * psi / 8) and z3["grads"] == pytest.approx(4 * psi / 8)
    tp8 = memory_breakdown(graph, cluster, make_plan(cfg, cluster, global_batch=8, seq_len=1024, tp=8))
    assert psi * 4 / 8 < tp8["params"] < psi * 4 / 8 * 1.01  # norms stay whole under TP
    pred = estimate(graph, cluster, make_plan(cfg, cluster, global_batch=16, seq_len=1024, dp=8, zero=3))
    assert pred.memory_bytes == z3 and pred.peak_memory_bytes == pytest.approx(sum(z3.values()))


def test_hybrid_sharding_keeps_zero_state_in_the_node_and_cuts_cross_node_traffic(make_graph, make_plan) -> None:
    """HSDP, zero_group=8 on dp=64 (8 nodes of 8): ZeRO-3 state 1/8, not 1/64, of the model
    (8x the fully sharded plan's), and the data-parallel collectives take less time: gathers and
    reduce-scatters stay on NVLink and only a 1/8 shard crosses the network, as an all-reduce, so
    fewer bytes move. (Time: the hierarchical collective model already keeps full-dp ZeRO-3 gathers
    NVLink-bound on h100-sxm 8x8, so HSDP's extra cross-node all-reduce is predicted slower there.)"""
    import dataclasses

    from meshplan import zoo
    from meshplan.cost_model.data_parallel import RankParams, data_parallel_cost
    cfg = zoo.config("llama3-8b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm", nodes=8)
    full = make_plan(cfg, cluster, global_batch=64, seq_len=1024, dp=64, zero=3)
    hybrid = dataclasses.replace(full, zero_group=8)
    m_full, m_hybrid = memory_breakdown(graph, cluster, full), memory_breakdown(graph, cluster, hybrid)
    for kind in ("params", "grads", "optimizer"):
        assert m_hybrid[kind] == pytest.approx(8 * m_full[kind])
    psi = zoo.param_count(cfg)
    params = RankParams(dense=psi, expert=0.0, bucket=psi / 32, units=33)
    bf16 = Software(name="bf16-reduce")  # gradients reduced in bf16 (in fp32, as meshplan's runtime does, the two
    # move the same bytes here: 8 x 63/64 against 8 x 7/8 + 8/8 x 7/8 per parameter)
    cost = {zg: data_parallel_cost(params, cluster=cluster, mesh=full.mesh, zero_stage=3, dtype="bfloat16",
                                   microbatches=1, fwd_window_s=0.0, bwd_window_s=0.0, zero_group=zg, software=bf16)
            for zg in (0, 8)}
    assert cost[8].bus_bytes < cost[0].bus_bytes
    assert estimate(graph, cluster, hybrid).peak_memory_bytes > estimate(graph, cluster, full).peak_memory_bytes


def test_zero2_under_fsdp2_shards_parameters_at_rest_and_holds_the_gathered_copies(make_graph, make_plan) -> None:
    """FSDP2's ZeRO-2 (reshard_after_forward=False, meshplan's runtime): the fp32 parameters are sharded
    like ZeRO-3's, and every unit's gathered bf16 copy is held from its forward to its backward (a
    buffer of 2 bytes per parameter). Megatron's ZeRO-2 keeps its bf16 parameters whole."""
    from meshplan import zoo
    from meshplan.cost_model.software import MEGATRON_CORE_2024

    cfg = zoo.config("llama3-8b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm")
    psi = zoo.param_count(cfg)
    plan = make_plan(cfg, cluster, global_batch=16, seq_len=1024, dp=8, zero=2, recompute="full")
    ours = memory_breakdown(graph, cluster, plan)
    z3 = memory_breakdown(graph, cluster, make_plan(cfg, cluster, global_batch=16, seq_len=1024, dp=8, zero=3,
                                                    recompute="full"))
    assert ours["params"] == pytest.approx(4 * psi / 8) and ours["grads"] == pytest.approx(4 * psi / 8)
    # the held copies: about the whole model in bf16 beyond ZeRO-3's two gathered layers
    assert ours["buffers"] - z3["buffers"] > 0.9 * 2 * psi * (1 + 0.10) - 2 * 2 * psi / cfg.layers * 1.1
    theirs = memory_breakdown(graph, cluster, plan, software=MEGATRON_CORE_2024)
    # Megatron reduces bf16 gradients in fp32: its main_grad buffers take 4 bytes per parameter
    assert theirs["params"] == pytest.approx(2 * psi) and theirs["grads"] == pytest.approx(4 * psi / 8)


def test_the_optimizer_step_holds_what_its_implementation_allocates(make_graph, make_plan) -> None:
    """torch's foreach AdamW takes the square root of every second moment at once (a temporary the size of
    one fp32 state tensor), a fused AdamW (Megatron's TE/Apex FusedAdam) updates in place, and a loop over the
    parameters (Composer's DecoupledAdamW) holds two temporaries of one parameter at a time. With activations
    smaller than the state, the temporary sets the step's peak."""
    import dataclasses

    from meshplan import zoo
    from meshplan.cost_model.footprint import ALLOCATOR_FRACTION
    from meshplan.cost_model.software import DEFAULT, MEGATRON_CORE_2024

    cfg = zoo.config("llama3-8b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm")
    psi = zoo.param_count(cfg)
    plan = make_plan(cfg, cluster, global_batch=8, seq_len=32, dp=8, zero=1)
    assert MEGATRON_CORE_2024.optimizer == "fused" and DEFAULT.optimizer == "foreach"
    by = {kind: memory_breakdown(graph, cluster, plan, software=dataclasses.replace(MEGATRON_CORE_2024, optimizer=kind))
          for kind in ("foreach", "fused", "per_param")}
    assert {k: v for k, v in by["fused"].items() if k != "buffers"} == {
        k: v for k, v in by["foreach"].items() if k != "buffers"}
    foreach_temp = 4 * psi / 8  # one fp32 tensor of the rank's ZeRO-1 shard of the state
    # counted where it exceeds the freed activations and the communication buffers (small here)
    extra = (by["foreach"]["buffers"] - by["fused"]["buffers"]) / (1 + ALLOCATOR_FRACTION)
    assert 0.9 * foreach_temp < extra + by["foreach"]["activations"] <= foreach_temp * 1.0001
    # the largest unit is the embedding or the output layer (vocab x hidden), its shard over the 8 ranks
    largest = 2 * 4 * cfg.vocab * cfg.hidden / 8
    assert 0 < by["per_param"]["buffers"] - by["fused"]["buffers"] <= largest * (1 + ALLOCATOR_FRACTION)
    with pytest.raises(Exception, match="optimizer must be one of"):
        dataclasses.replace(DEFAULT, optimizer="adafactor")


def test_expandable_segments_take_no_fragmentation_allowance(make_graph, make_plan) -> None:
    """The splitting allocator's fragmentation is an allowance of ALLOCATOR_FRACTION over what the step allocates
    and frees (activations, gradients, buffers), not over the parameters and optimizer states, allocated once and
    updated in place; expandable segments unmap free blocks' pages, so a program that runs them holds only what it
    allocates."""
    import dataclasses

    from meshplan import zoo
    from meshplan.cost_model.footprint import ALLOCATOR_FRACTION
    from meshplan.cost_model.software import MEGATRON_CORE_2024

    cfg = zoo.config("llama3-8b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm")
    plan = make_plan(cfg, cluster, global_batch=16, seq_len=2048, dp=8, zero=1)
    assert not MEGATRON_CORE_2024.expandable_segments
    split = memory_breakdown(graph, cluster, plan, software=MEGATRON_CORE_2024)
    expandable = memory_breakdown(graph, cluster, plan,
                                  software=dataclasses.replace(MEGATRON_CORE_2024, expandable_segments=True))
    assert {k: v for k, v in split.items() if k != "buffers"} == {k: v for k, v in expandable.items() if k != "buffers"}
    churn = sum(v for k, v in expandable.items() if k not in ("params", "optimizer"))
    assert expandable["params"] > 0 and expandable["optimizer"] > 0
    assert sum(split.values()) == pytest.approx(sum(expandable.values()) + ALLOCATOR_FRACTION * churn)


def test_a_program_without_master_weights_keeps_bf16_states_and_gradient_shards(make_graph, make_plan) -> None:
    """NeMo Automodel (Software.master_weights False): bf16 parameters updated in place by torch.optim.Adam, whose
    moments take the parameters' dtype: 2 + 2 + 4 bytes a parameter where a master-weight optimizer holds 2 + 2 +
    12; FSDP2 reduces in fp32 but casts the shard back to bf16, so its gradients stay at 2 bytes (Megatron's fp32
    main_grad buffers are not FSDP2's), and only a unit's unsharded gradients gain the fp32 copy."""
    import dataclasses

    from meshplan import zoo
    from meshplan.cost_model.software import software_named

    cfg = zoo.config("llama3-8b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm")
    psi = zoo.param_count(cfg)
    plan = make_plan(cfg, cluster, global_batch=16, seq_len=1024, dp=8, zero=3, recompute="full")
    automodel = software_named("nemo-automodel-2025")
    assert not automodel.master_weights and automodel.fp32_grad_reduce and not automodel.fp32_params
    bf16 = memory_breakdown(graph, cluster, plan, software=automodel)
    master = memory_breakdown(graph, cluster, plan, software=dataclasses.replace(automodel, master_weights=True))
    assert bf16["params"] == pytest.approx(2 * psi / 8) and bf16["optimizer"] == pytest.approx(4 * psi / 8)
    assert master["optimizer"] == pytest.approx(12 * psi / 8)
    assert bf16["grads"] == master["grads"] == pytest.approx(2 * psi / 8)
