"""Time of one NCCL-style collective over a group of ranks, costed on the tiers it crosses.

Per nccl-tests ``doc/PERFORMANCE.md`` (a0b82b22), a collective over n ranks of per-rank link
bandwidth B takes, for S bytes (the full array: recvcount*n for all-gather, sendcount*n for
reduce-scatter, the whole buffer of a rank for all-to-all)::

    all-reduce      S/B * 2(n-1)/n          reduce-scatter, all-gather, all-to-all   S/B * (n-1)/n
    send-recv       S/B                     broadcast                                 S/B

plus a latency term ``alpha * steps``: ceil(log2 n) steps for an all-reduce (2x: NCCL picks a tree,
depth log2 n, when latency dominates), an all-to-all and a broadcast; n - 1 hops for an all-gather or
reduce-scatter, which NCCL runs on rings (``ring_steps``: its tuning model in ``src/graph/tuning.cc``
counts ``nsteps = nRanks - 1`` hops, ``nNodes - 1`` of them on the network), so that ZeRO's gathers
over hundreds of ranks pay hundreds of hops.

Where a group lives: ranks are numbered with tp innermost, then cp, dp, pp (``ir.plan``), so a
group is ``group_size`` ranks spaced ``stride`` apart. Tier i connects ``domain_size`` consecutive
ranks; ``min(n, D_i // stride)`` members of the group share one tier-i domain. A group that
spans domains is costed hierarchically, in phases from the inside out (2D/hierarchical
all-reduce): phase i runs over k_i = members(i) / members(i-1) ranks on tier i, on data shrunk
by the members of the phases inside it:

    all-gather / reduce-scatter   phase_i = S / prod_{j<i} k_j * (k_i - 1)/k_i / B_i
    all-reduce                    2x that (reduce-scatter, then all-gather)
    all-to-all                    phase_i = S * (prod_{j<=i} k_j - prod_{j<i} k_j)/n / B_i

The phases are pipelined, not sequential: NCCL cuts the data into chunks that flow through the
NVLink and network hops of its rings at the same time (one ring per NIC), so the slowest phase
sets the time, ``max_i phase_i``. Check: a multi-node all-reduce on DGX A100 (8 x 200 Gb/s HDR
per node) gives busbw = 2(n-1)/n S / t -> min(0.8 * 300, 8 * 0.9 * 25) = 180 GB/s here, against
"we measure 192GB/s AllReduce BusBW" (NVIDIA/nccl issue #812); summing the phases would give 109.

B_i is the tier's per-GPU bandwidth times the achievable factor of its kind (``hardware.py``):
every GPU has its own NIC (rail-optimized DGX/HGX), so groups that run side by side do not share it.

``flat_collective_time`` is the other extreme: nothing is aggregated inside a domain, every rank's
whole bus volume (nccl-tests' factor times S) crosses the slowest tier the group spans, on that
rank's own link. That is how ZeRO++ (Wang et al. 2023, arXiv:2306.10209, sec. 3) accounts ZeRO-3's
cross-node traffic, and it is what DeepSpeed ZeRO-3's throughput in Narayanan et al. 2021 Table 2
shows: the step time stays constant as the GPU count doubles at a fixed batch and grows with the
parameter count, at ~6-8 bytes per parameter over ~20 GB/s per GPU.
"""
from __future__ import annotations

import math
from enum import StrEnum
from functools import lru_cache

from .hardware import Cluster, Tier


class Collective(StrEnum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    SEND_RECV = "send-recv"
    BROADCAST = "broadcast"


_BUS_FACTOR = {
    Collective.ALL_REDUCE: lambda n: 2.0 * (n - 1) / n,
    Collective.ALL_GATHER: lambda n: (n - 1) / n,
    Collective.REDUCE_SCATTER: lambda n: (n - 1) / n,
    Collective.ALL_TO_ALL: lambda n: (n - 1) / n,
    Collective.SEND_RECV: lambda n: 1.0,
    Collective.BROADCAST: lambda n: 1.0,
}


def bus_bytes(kind: str, nbytes: float, group_size: int) -> float:
    """Bytes each rank moves on its link: S times the nccl-tests bus-bandwidth factor."""
    if group_size <= 1:
        return 0.0
    factor = _BUS_FACTOR.get(kind)  # a Collective's name looks its member up (StrEnum); anything else is refused
    return nbytes * (factor or _BUS_FACTOR[Collective(kind)])(group_size)


@lru_cache(maxsize=4096)
def group_phases(group_size: int, stride: int, cluster: Cluster) -> tuple[tuple[Tier, float], ...]:
    """The tiers a group of ``group_size`` ranks ``stride`` apart crosses, inner first, each with
    the number of ranks k_i that phase runs over (their product is ``group_size``)."""
    phases: list[tuple[Tier, float]] = []
    inner = 1
    last = len(cluster.tiers) - 1
    for i, tier in enumerate(cluster.tiers):
        within = group_size if i == last else min(group_size, max(1, tier.domain_size // max(stride, 1)))
        if within > inner:
            phases.append((tier, within / inner))
            inner = within
    return tuple(phases)


RING = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)


def ring_steps(phases: tuple[tuple[Tier, float], ...]) -> tuple[float, ...]:
    """Hops of a ring over the group that cross each phase's tier, inner first: one ring visits every
    rank, n - 1 hops in all, of which those between domains of tier i number O_i (k_i - 1), O_i the
    ranks of the phases outside it (NCCL ``src/graph/tuning.cc``: ``nInterSteps = nNodes - 1`` of
    ``nsteps = nRanks - 1`` for an all-gather or reduce-scatter, the rest at the intra-node latency)."""
    ks = [round(k) for _, k in phases]
    outer = [1] * len(ks)
    for i in range(len(ks) - 2, -1, -1):
        outer[i] = outer[i + 1] * ks[i + 1]
    return tuple(o * (k - 1) for o, k in zip(outer, ks))


def _latency_s(phases: tuple[tuple[Tier, float], ...], steps_factor: float, kind: str) -> float:
    """Latency of a collective over ``phases``: a tree's depth per tier (all-reduce, broadcast), or the
    hops of a ring (all-gather and reduce-scatter: NCCL runs them on rings only, the tree being for
    all-reduce, and its PAT algorithm only with one GPU per node), so that their latency grows with
    the group, as NCCL's own tuning model has it."""
    if kind in RING:
        return sum(t.latency_of(kind, round(k), steps_factor, steps=s)
                   for (t, k), s in zip(phases, ring_steps(phases)) if k > 1)
    return sum(t.latency_of(kind, round(k), steps_factor) for t, k in phases if k > 1)


def collective_time(kind: str, nbytes: float, group_size: int, stride: int, cluster: Cluster) -> float:
    """Seconds for one collective of ``nbytes`` (nccl-tests' S) over ``group_size`` ranks ``stride``
    apart. A send-recv is between a rank and the one ``stride`` away (pass group_size=2)."""
    if group_size <= 1 or nbytes <= 0:
        return 0.0
    per_byte_s, latency_s = _linear(kind, group_size, stride, cluster)
    return nbytes * per_byte_s + latency_s


@lru_cache(maxsize=8192)
def _linear(kind: str, group_size: int, stride: int, cluster: Cluster) -> tuple[float, float]:
    """(seconds per byte, seconds) of ``collective_time``, which is linear in the bytes: its bandwidth term is
    the bytes over the slowest phase's rate, its latency does not depend on them. Cached: a search costs the
    same few groups of a cluster for tens of thousands of candidates."""
    kind = Collective(kind)
    if kind == Collective.SEND_RECV:
        tier = group_phases(2, stride, cluster)[-1][0]
        return 1.0 / tier.bus_Bps(kind), tier.latency_of(kind, 2)
    phases = group_phases(group_size, stride, cluster)
    if kind == Collective.BROADCAST:
        slowest = min(t.bus_Bps(kind, round(k)) for t, k in phases)
        return 1.0 / slowest, _latency_s(phases, 1.0, kind)
    slowest, inner = 0.0, 1.0
    for tier, k in phases:
        if kind == Collective.ALL_TO_ALL:
            phase_s = (inner * k - inner) / group_size / tier.bus_Bps(kind, round(k))
        else:
            phase_s = 1.0 / inner * (k - 1) / k / tier.bus_Bps(kind, round(k))
        slowest = max(slowest, phase_s)
        inner *= k
    if kind == Collective.ALL_REDUCE:
        return 2.0 * slowest, _latency_s(phases, 2.0, kind)
    return slowest, _latency_s(phases, 1.0, kind)


def flat_collective_time(kind: str, nbytes: float, group_size: int, stride: int, cluster: Cluster) -> float:
    """Seconds for one collective whose per-rank bus volume all crosses the slowest tier the group
    spans (no aggregation inside a node); equal to ``collective_time`` inside one domain."""
    kind = Collective(kind)
    if group_size <= 1 or nbytes <= 0:
        return 0.0
    phases = group_phases(group_size, stride, cluster)
    if len(phases) <= 1 or kind in (Collective.SEND_RECV, Collective.BROADCAST):
        return collective_time(kind, nbytes, group_size, stride, cluster)
    slowest = min(t.bus_Bps(kind, round(k)) for t, k in phases)
    steps = 2.0 if kind == Collective.ALL_REDUCE else 1.0
    return bus_bytes(kind, nbytes, group_size) / slowest + _latency_s(phases, steps, kind)


def deduplicated_all_to_all_time(token_bytes: float, top_k: int, experts: int, group_size: int, stride: int,
                                 cluster: Cluster, routing: str = "uniform") -> float:
    """Seconds for one MoE dispatch (or combine) of ``token_bytes`` of tokens per rank, each routed to ``top_k``
    of ``experts`` spread evenly over ``group_size`` ranks ``stride`` apart, by a dispatcher that sends a token
    over the network once per remote domain that hosts one of its experts and forwards it to the experts'
    GPUs inside that domain (DeepEP, HybridEP: ``Software.ep_dispatch``). With routing uniform over the
    experts, a domain holding E/D of the E experts receives a token with probability
    1 - C(E - E/D, k) / C(E, k), so each rank sends ``token_bytes`` times (D - 1) times that over the
    network, against k (D - 1)/D copies for an all-to-all. Inside a domain the token moves once to each rank
    that holds one of its experts (the same count with E/ep experts a rank: ep (1 - C(E - E/ep, k) / C(E, k))
    ranks, 5.29 of 8 for DeepSeek-V3's top 8 of 256 over ep 8, not k = 8 copies), as an all-to-all there; the
    two phases are pipelined (the slower sets the time, as in ``collective_time``). A group inside one domain
    is that all-to-all alone: the Megatron-Core MoE report measured HybridEP's dispatch at EP 8 in about half
    the all-to-all's time (arXiv:2603.07685 Table 7: 661 against 1,265 us on H100, 391 against 735 on GB200;
    ``bench/moe_dispatch.py``).

    ``routing`` "round-robin" (``Software.ep_routing``): token t goes to experts t*k .. t*k+k-1 (mod E), so its
    experts sit on the few consecutive ranks ``round_robin_spread`` counts; the dispatcher sends it once to each
    of their domains over the network and once to each of their ranks inside a domain."""
    phases = group_phases(group_size, stride, cluster)
    inner = round(phases[0][1]) if phases else 1
    domains = group_size / inner
    if routing == "round-robin":
        copies, spanned = round_robin_spread(experts, top_k, group_size, inner)
        remote = spanned * (domains - 1) / domains  # the sender's own domain is one of D, whichever the token
    else:  # the ranks, and the domains, of E/ep and E/D experts each, that hold one of the token's k experts
        copies = group_size * _hit_share(experts, round(experts / group_size), top_k)
        remote = (domains - 1) * _hit_share(experts, round(experts / domains), top_k)
    if len(phases) <= 1 or token_bytes <= 0:
        return collective_time("all-to-all", token_bytes * copies, group_size, stride, cluster)
    inner_tier = phases[0][0]
    outer_s = max(token_bytes * remote / tier.bus_Bps(Collective.ALL_TO_ALL, round(n)) for tier, n in phases[1:])
    inner_s = token_bytes * copies * (inner - 1) / inner / inner_tier.bus_Bps(Collective.ALL_TO_ALL, inner)
    return max(inner_s, outer_s) + _latency_s(phases, 1.0, Collective.ALL_TO_ALL)


def _hit_share(experts: int, held: int, top_k: int) -> float:
    """Probability that a token routed uniformly to ``top_k`` of ``experts`` picks at least one of ``held`` of them:
    1 - C(E - held, k) / C(E, k)."""
    k = min(top_k, experts)
    return 1.0 - math.comb(experts - held, k) / math.comb(experts, k)


@lru_cache(maxsize=256)
def round_robin_spread(experts: int, top_k: int, group_size: int, per_domain: int) -> tuple[float, float]:
    """(ranks, domains) the ``top_k`` experts of a token span on average when token t is routed to experts
    t*k .. t*k+k-1 (mod E), the experts placed E/ep to a rank in rank order and ``per_domain`` consecutive
    ranks to a domain: the mean over the start experts t*k mod E that tokens cycle through."""
    per_rank = max(1, experts // group_size)
    k = min(top_k, experts)
    starts = sorted({(t * k) % experts for t in range(experts)})
    ranks = domains = 0
    for start in starts:
        held = {((start + j) % experts) // per_rank for j in range(k)}
        ranks += len(held)
        domains += len({r // max(per_domain, 1) for r in held})
    return ranks / len(starts), domains / len(starts)
