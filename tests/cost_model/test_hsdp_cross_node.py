"""HSDP shard groups that span nodes (FSDP2's shard degree above a node, as NeMo Automodel runs Llama 3
70B with a shard group of 32 on 64 GPUs): the search offers them, and the cost model prices their
gathers and reduce-scatters hierarchically, the part that crosses nodes on the network tier's numbers
(``cost_model/collectives.py``)."""
from __future__ import annotations

from pathlib import Path

import pytest

from meshplan import ir
from meshplan.cost_model import parse_cluster
from meshplan.cost_model.collectives import collective_time, group_phases
from meshplan.cost_model.data_parallel import STATE_BYTES, RankParams, data_parallel_cost
from meshplan.cost_model.software import Software
from meshplan.solver.space import candidates

ROOT = Path(__file__).resolve().parents[2]
S = 2e9  # bytes gathered: 1B bf16 parameters


def test_cross_node_all_gather_is_the_tier_formula() -> None:
    """zero_group 16 on h100-sxm:4x8 (tp 1): 8 ranks on NVLink, 2 nodes over InfiniBand; the time is
    the slower phase, S * 7/8 / B_nvlink against S / 8 * 1/2 / B_ib, plus each tier's latency."""
    cluster = parse_cluster("h100-sxm:4x8")
    nvl, ib = cluster.tiers
    assert [(t.name, k) for t, k in group_phases(16, 1, cluster)] == [("nvlink", 8), ("infiniband", 2)]
    nvl_s = S * 7 / 8 / nvl.bus_Bps("all-gather", 8)
    ib_s = S / 8 * (2 - 1) / 2 / ib.bus_Bps("all-gather", 2)
    # a ring over the 16 ranks: 14 NVLink hops and 1 between the nodes (collectives.ring_steps)
    latency = nvl.latency_of("all-gather", 8, steps=14) + ib.latency_of("all-gather", 2, steps=1)
    assert collective_time("all-gather", S, 16, 1, cluster) == pytest.approx(max(nvl_s, ib_s) + latency, rel=1e-12)
    # with tp 2 inside each node (stride 2): 4 ranks per node, 4 nodes
    nvl_s = S * 3 / 4 / nvl.bus_Bps("all-gather", 4)
    ib_s = S / 4 * 3 / 4 / ib.bus_Bps("all-gather", 4)
    latency = nvl.latency_of("all-gather", 4, steps=12) + ib.latency_of("all-gather", 4, steps=3)
    assert collective_time("all-gather", S, 16, 2, cluster) == pytest.approx(max(nvl_s, ib_s) + latency, rel=1e-12)


def test_on_a_slow_network_the_cross_node_part_sets_the_time() -> None:
    """A100 nodes with 4 x 100 Gb/s (5.6 GB/s per GPU achievable): a shard group of 16 spends
    S / 8 * 1/2 / B_ethernet on the network, far above its NVLink phase; a group of 8 stays in the node."""
    cluster = parse_cluster(str(ROOT / "examples/clusters/a100-4x100g.json"))
    net = cluster.tiers[-1]
    ib_s = S / 8 / 2 / net.bus_Bps("all-gather", 2)
    t16 = collective_time("all-gather", S, 16, 1, cluster)
    assert t16 == pytest.approx(ib_s + cluster.tiers[0].latency_of("all-gather", 8, steps=14)
                                + net.latency_of("all-gather", 2, steps=1), rel=1e-12)
    assert t16 > 3 * collective_time("all-gather", S, 8, 1, cluster)


def test_data_parallel_cost_runs_the_shard_group_across_nodes() -> None:
    """ZeRO-3 with zero_group 16 on 4 nodes of 8 (dp 32): the bus bytes are the shard group's
    gathers and reduce-scatters over 16 ranks plus the 1/16 shard's all-reduce over the 2 replicas; the
    time grows as the group spans a slower network."""
    params = RankParams(dense=1e9, expert=0.0, bucket=1e9 / 32, units=33)
    mesh = ir.Mesh(dp=32)

    def cost(spec: str, zero_group: int):
        return data_parallel_cost(params, cluster=parse_cluster(spec), mesh=mesh, zero_stage=3, dtype="bfloat16",
                                  microbatches=1, fwd_window_s=0.0, bwd_window_s=0.0, zero_group=zero_group,
                                  software=Software(name="bf16-reduce"))  # gradients reduced in bf16

    got = cost("h100-sxm:4x8", 16)
    param_b, grad_b, _ = STATE_BYTES["bfloat16"]  # bytes per parameter and per gradient element
    expected = (2 * 1e9 * param_b * 15 / 16 + 1e9 * grad_b * 15 / 16  # gathers (fwd, bwd), reduce-scatter
                + 1e9 / 16 * grad_b * 2 * (2 - 1) / 2)  # the shard's all-reduce over 2 replicas
    assert got.bus_bytes == pytest.approx(expected, rel=1e-9)
    slow = str(ROOT / "examples/clusters/a100-4x100g.json")
    assert cost(slow, 16).per_microbatch_s > cost(slow, 8).per_microbatch_s


def test_search_offers_shard_groups_across_nodes() -> None:
    """8 nodes of 8, tp 1: shard groups of 2..32 (in a node, and spanning 2 or 4 nodes) beside full
    sharding; with tp 2 a node holds 4 data ranks, and groups of 8 and 16 span nodes."""
    dims = ir.ModelDims(family="llama", layers=8, hidden=256, heads=8, kv_heads=8, ffn_hidden=1024, vocab=1024)
    found = candidates(dims, world=64, domain=8, global_batch=64, seq_len=1024, fixed={"zero": 3})
    groups = {c.tp: set() for c in found}
    for c in found:
        if c.pp == c.cp == 1:
            groups[c.tp].add(c.zero_group)
    assert groups[1] == {0, 2, 4, 8, 16, 32}
    assert {8, 16} <= groups[2] and 3 not in groups[2]
