"""Collective times against the nccl-tests bus-bandwidth formulas, and where groups live."""
from __future__ import annotations

import dataclasses

import pytest

from meshplan.cost_model import BUS_EFFICIENCY, Cluster, TierKind, bus_bytes, collective_time, group_phases

H100x2 = Cluster.preset("h100-sxm", nodes=2)
NV = 450e9 * BUS_EFFICIENCY[TierKind.SCALE_UP]
IB = 50e9 * BUS_EFFICIENCY[TierKind.SCALE_OUT]
S = 1e9


@pytest.mark.parametrize("kind, factor, steps", [
    ("all-reduce", 2 * 7 / 8, 6), ("all-gather", 7 / 8, 7), ("reduce-scatter", 7 / 8, 7), ("all-to-all", 7 / 8, 3),
])
def test_inside_a_node_matches_the_busbw_formula(kind: str, factor: float, steps: int) -> None:
    lat = H100x2.tiers[0].latency_s
    assert collective_time(kind, S, 8, 1, H100x2) == pytest.approx(S / NV * factor + steps * lat)
    assert bus_bytes(kind, S, 8) == pytest.approx(S * factor)


def test_across_nodes_one_gpu_per_node_runs_at_the_nic() -> None:
    lat = H100x2.tiers[1].latency_s
    # two ranks 8 apart: one per node
    assert collective_time("all-reduce", S, 2, 8, H100x2) == pytest.approx(S / IB * 2 * 1 / 2 + 2 * lat)
    assert collective_time("send-recv", S, 2, 8, H100x2) == pytest.approx(S / IB + lat)
    assert collective_time("send-recv", S, 2, 1, H100x2) == pytest.approx(S / NV + H100x2.tiers[0].latency_s)


def test_a_group_inside_a_node_is_faster_than_the_same_group_across_nodes() -> None:
    cluster = Cluster.preset("h100-sxm", nodes=8)
    for kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        inside = collective_time(kind, S, 8, 1, cluster)  # ranks 0..7: one node
        across = collective_time(kind, S, 8, 8, cluster)  # ranks 0, 8, ..., 56: eight nodes
        assert inside < across / 5


def test_groups_spanning_nodes_are_costed_in_phases() -> None:
    nvlink, ib = H100x2.tiers
    assert group_phases(16, 1, H100x2) == ((nvlink, 8), (ib, 2))
    assert group_phases(8, 2, H100x2) == ((nvlink, 4), (ib, 2))
    assert group_phases(2, 8, H100x2) == ((ib, 2),)
    assert group_phases(8, 1, H100x2) == ((nvlink, 8),)
    # the slowest phase sets the time (NCCL pipelines the NVLink and network hops of its rings)
    inner = S * 7 / 8 / NV
    outer = S / 8 * 1 / 2 / IB
    lat = 14 * nvlink.latency_s + 1 * ib.latency_s  # a ring over 16 ranks: 15 hops, one between the nodes
    assert collective_time("all-gather", S, 16, 1, H100x2) == pytest.approx(max(inner, outer) + lat)


def test_ring_collectives_pay_a_hop_per_rank_as_nccls_tuning_model_does() -> None:
    """NCCL src/graph/tuning.cc: a ring all-gather or reduce-scatter over nRanks in nNodes has nsteps =
    nRanks - 1 hops, nNodes - 1 of them on the network; an all-reduce at scale runs on the tree (log2)."""
    cluster = Cluster.preset("h100-sxm", nodes=64)
    nvlink, ib = cluster.tiers
    tiny = 1.0  # bytes: latency alone
    for kind in ("all-gather", "reduce-scatter"):
        assert collective_time(kind, tiny, 512, 1, cluster) == pytest.approx(
            448 * nvlink.latency_s + 63 * ib.latency_s, rel=1e-6)
        # one rank per node (a ZeRO group strided over the nodes): every hop on the network
        assert collective_time(kind, tiny, 64, 8, cluster) == pytest.approx(63 * ib.latency_s, rel=1e-6)
    # the latency of a 512-rank all-gather is 30x a 16-rank one; an all-reduce's grows with log2 n
    assert collective_time("all-gather", tiny, 512, 1, cluster) > 30 * collective_time("all-gather", tiny, 16, 1, cluster)
    assert collective_time("all-reduce", tiny, 512, 1, cluster) == pytest.approx(
        2 * (3 * nvlink.latency_s + 6 * ib.latency_s), rel=1e-6)


def test_multi_node_dgx_a100_all_reduce_busbw_is_near_the_measured_192_gbps() -> None:
    cluster = Cluster.preset("a100-80gb", nodes=16)
    n, size = 128, 8e9
    busbw = size * 2 * (n - 1) / n / collective_time("all-reduce", size, n, 1, cluster)
    assert 160e9 < busbw < 200e9  # NVIDIA/nccl issue #812: "we measure 192GB/s AllReduce BusBW"


def test_trivial_groups_cost_nothing() -> None:
    assert collective_time("all-reduce", S, 1, 1, H100x2) == 0.0
    assert collective_time("all-gather", 0, 8, 1, H100x2) == 0.0
    assert bus_bytes("all-reduce", S, 1) == 0.0


def test_a_deduplicating_dispatch_sends_each_token_once_per_remote_node() -> None:
    """DeepEP/HybridEP (Software.ep_dispatch): DeepSeek-V3's 256 experts, top-8, over ep 32 on B200 nodes of 8: each
    of the 3 other nodes holds 64 experts and receives a token with probability 1 - C(192, 8)/C(256, 8); the
    network phase moves that many copies of the token, against 8 x 3/4 for an all-to-all."""
    import math

    from meshplan.cost_model.collectives import deduplicated_all_to_all_time

    cluster = Cluster.preset("b200", nodes=4)
    nvlink, ib = cluster.tiers
    tokens = 4096 * 7168 * 2.0
    remote = 3 * (1 - math.comb(192, 8) / math.comb(256, 8))
    network_s = tokens * remote / ib.bus_Bps("all-to-all", 4)
    latency = nvlink.latency_of("all-to-all", 8) + ib.latency_of("all-to-all", 4)
    assert deduplicated_all_to_all_time(tokens, 8, 256, 32, 1, cluster) == pytest.approx(network_s + latency, rel=1e-9)
    assert collective_time("all-to-all", 8 * tokens, 32, 1, cluster) > 2 * deduplicated_all_to_all_time(
        tokens, 8, 256, 32, 1, cluster)
    # inside one node the token goes once to each rank holding one of its experts (32 a rank): 8 (1 - C(224, 8) /
    # C(256, 8)) = 5.29 copies, not the all-to-all's 8
    ranks = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert ranks == pytest.approx(5.29, abs=0.01)
    assert deduplicated_all_to_all_time(tokens, 8, 256, 8, 1, cluster) == pytest.approx(collective_time(
        "all-to-all", ranks * tokens, 8, 1, cluster), rel=1e-12)
    # with one expert per token a token crosses once or not at all, as in an all-to-all
    assert deduplicated_all_to_all_time(tokens, 1, 256, 32, 1, cluster) == pytest.approx(
        collective_time("all-to-all", tokens, 32, 1, cluster), rel=1e-9)


def test_round_robin_routing_sends_a_token_to_the_one_node_its_consecutive_experts_live_on() -> None:
    """NeMo Automodel's benchmark gate (Software.ep_routing "round-robin") routes token t to experts t*k .. t*k+k-1:
    DeepSeek-V3's 8 consecutive experts of 256 over ep 64 (4 a rank) are two ranks of one node, so the
    deduplicating dispatch crosses the network once to that node (7 times in 8 a remote one) and reaches two ranks
    there, where uniform routing reaches 5 of the 8 nodes; Qwen3-30B's 8 of 128 over ep 8 are one rank's."""
    from meshplan.cost_model.collectives import deduplicated_all_to_all_time, round_robin_spread

    assert round_robin_spread(256, 8, 64, 8) == (2.0, 1.0)
    assert round_robin_spread(128, 8, 8, 8) == (1.0, 1.0)
    ranks, nodes = round_robin_spread(384, 8, 32, 8)  # Kimi K2: 12 experts a rank, 8 consecutive on one or two
    assert ranks == pytest.approx(4 / 3) and 1.0 <= nodes < ranks
    cluster = Cluster.preset("h100-sxm", nodes=8)
    nvlink, ib = cluster.tiers
    tokens = 4096 * 7168 * 2.0
    network_s = tokens * 1.0 * 7 / 8 / ib.bus_Bps("all-to-all", 8)
    nvlink_s = tokens * 2.0 * 7 / 8 / nvlink.bus_Bps("all-to-all", 8)
    latency = nvlink.latency_of("all-to-all", 8) + ib.latency_of("all-to-all", 8)
    robin = deduplicated_all_to_all_time(tokens, 8, 256, 64, 1, cluster, routing="round-robin")
    assert robin == pytest.approx(max(network_s, nvlink_s) + latency, rel=1e-9)
    assert robin < deduplicated_all_to_all_time(tokens, 8, 256, 64, 1, cluster) / 3
    # inside one node: an all-to-all of one copy per rank the token's experts span
    assert deduplicated_all_to_all_time(tokens, 8, 128, 8, 1, cluster, routing="round-robin") == collective_time(
        "all-to-all", tokens, 8, 1, cluster)


def test_software_refuses_an_unknown_expert_routing() -> None:
    from meshplan.cost_model.software import DEFAULT, software_named
    from meshplan.ir.errors import PlanError

    with pytest.raises(PlanError, match="ep_routing must be one of"):
        dataclasses.replace(DEFAULT, ep_routing="random")
    assert software_named("nemo-automodel-2025").ep_routing == "round-robin" and DEFAULT.ep_routing == "uniform"
