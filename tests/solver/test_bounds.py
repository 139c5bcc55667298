"""Bounded work: sizes beyond any real cluster or model are refused up front with the limit named
(``ir/limits.py``), divisors come from factorization, and each pin no candidate can satisfy gets its
own message instead of "no strategy divides the work"."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import ir
from meshplan.cost_model import Cluster
from meshplan.ir import limits
from meshplan.solver.pins import check_pins_fit
from meshplan.solver.search import Request, check_request, layers_per_rank, recompute_list
from meshplan.solver.space import RUNTIME, candidates, check_fixed, divisors
from deadline import within  # tests/deadline.py

DENSE = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
MOE = ir.ModelDims(family="moe", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000,
                   experts=8, top_k=2)


# --- divisors -------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=20_000))
def test_divisors_match_brute_force(n: int) -> None:
    assert divisors(n) == tuple(d for d in range(1, n + 1) if n % d == 0)


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=1, max_value=2**64))
def test_divisors_of_large_numbers_are_sorted_complete_pairs(n: int) -> None:
    with within(20):
        found = divisors(n)
    assert list(found) == sorted(set(found)) and found[0] == 1 and found[-1] == n
    assert all(n % d == 0 for d in found)
    assert set(found) == {n // d for d in found}  # closed under d -> n/d


def test_divisors_of_huge_powers_and_primes_return() -> None:
    with within(20):
        assert divisors(2**62) == tuple(2**k for k in range(63))
        assert divisors(2**61 - 1) == (1, 2**61 - 1)  # a Mersenne prime: trial division ran 1.5e9 steps
        p, q = 1_000_000_007, 998_244_353  # two primes: a semiprime near 10^18
        assert divisors(p * q) == (1, q, p, p * q)
        big = 99999999999999999999 * 8  # the fuzzer's cluster: 10^20 - 1 nodes of 8
        found = divisors(big)
        assert all(big % d == 0 for d in found) and found[-1] == big and len(found) == 1536


@pytest.mark.parametrize("bad", [0, -4, True, 2.0])
def test_divisors_refuse_non_positive_integers(bad) -> None:
    with pytest.raises(ir.PlanError, match="positive integer"):
        divisors(bad)


# --- ir/limits.py -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, limit, value, message", [
    ("--tp", limits.MAX_GPUS, 0, r"--tp must be a positive integer, got 0"),
    ("--tp", limits.MAX_GPUS, -3, r"--tp must be a positive integer, got -3"),
    ("--tp", limits.MAX_GPUS, True, r"got True \(bool\)"),
    ("--tp", limits.MAX_GPUS, 2.0, r"got 2.0 \(float\)"),
    ("--tp", limits.MAX_GPUS, "2", r"got '2' \(str\)"),
    ("gpus", limits.MAX_GPUS, limits.MAX_GPUS + 1, r"gpus 10000001 exceeds the limit of 10000000 \(10\^7\)"),
    ("global_batch", limits.MAX_GLOBAL_BATCH, 2**63, r"exceeds the limit of 1099511627776 \(2\^40\)"),
    ("seq_len", limits.MAX_SEQ_LEN, 2**24 + 1, r"exceeds the limit of 16777216 \(2\^24\)"),
    ("layers", limits.MAX_LAYERS, 1025, r"exceeds the limit of 1024 \(2\^10\)"),
])
def test_check_positive_int_names_the_value_and_the_limit(name, limit, value, message) -> None:
    with pytest.raises(ir.PlanError, match=message):
        limits.check_positive_int(name, value, limit)


@pytest.mark.parametrize("limit", [limits.MAX_GPUS, limits.MAX_LAYERS, limits.MAX_GLOBAL_BATCH, limits.MAX_SEQ_LEN])
def test_the_limit_itself_is_accepted(limit) -> None:
    assert limits.check_positive_int("x", limit, limit) == limit
    assert limits.check_positive_int("x", 1, limit) == 1


def test_checker_raises_the_subclass_asked_for() -> None:
    with pytest.raises(ir.InvalidClusterError, match="GPUs"):
        limits.check_positive_int("world", 10**20, limits.MAX_GPUS, error=ir.InvalidClusterError, what="GPUs")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, 0, 0.0, limits.MAX_TIME_LIMIT_S * 2, "30", None])
def test_time_limits_that_are_not_positive_finite_seconds_are_refused(value) -> None:
    with pytest.raises(ir.PlanError, match="time_limit_s must be a"):
        limits.check_time_limit("time_limit_s", value)


def test_time_limit_in_range_is_accepted() -> None:
    assert limits.check_time_limit("t", 30) == 30.0 and limits.check_time_limit("t", 0.25) == 0.25


@pytest.mark.parametrize("sizes, message", [
    (dict(global_batch=2**40 + 1, seq_len=8), "global_batch 1099511627777 exceeds"),
    (dict(global_batch=8, seq_len=2**24 + 1), "seq_len 16777217 exceeds"),
    (dict(global_batch=8, seq_len=8, world=10**7 + 8), "world size 10000008 exceeds .* GPUs"),
    (dict(global_batch=8, seq_len=8, layers=10**6), "layers 1000000 exceeds .* layers"),
    (dict(global_batch=0, seq_len=8), "global_batch must be a positive integer, got 0"),
])
def test_check_sizes_names_each_limit(sizes, message) -> None:
    with pytest.raises(ir.PlanError, match=message):
        limits.check_sizes(**sizes)


# --- pins alone (space.check_fixed) ------------------------------------------------------------------

@pytest.mark.parametrize("fixed, message", [
    ({"tp": 0}, r"fixed: tp must be a positive integer, got 0"),
    ({"micro_batch": 0}, r"fixed: micro_batch must be a positive integer, got 0"),
    ({"dp": -2}, r"fixed: dp must be a positive integer, got -2"),
    ({"pp": 2**70}, r"fixed: pp 1180591620717411303424 exceeds the limit of 10000000"),
    ({"vp": 3, "pp": 1}, r"vp=3 with pp=1; .* vp needs pp > 1"),
    ({"vp": 2, "schedule": "gpipe"}, r"vp=2 with schedule=gpipe; only interleaved-1f1b"),
    ({"vp": 1, "schedule": "interleaved-1f1b"}, r"interleaving needs vp > 1"),
    ({"schedule": "gpipe", "pp": 1}, r"schedule=gpipe with pp=1"),
    ({"sp": True, "tp": 1}, r"sp=True with tp=1; .*sp needs tp > 1"),
    ({"sp": "yes"}, r"sp='yes'; expected True or False"),
    ({"zero": True}, r"zero=True"),
    ({"zero_group": 1}, r"zero_group=1; expected 0 .* or a shard group of g > 1"),
    ({"zero_group": True}, r"zero_group=True; expected 0"),
    ({"zero_group": 4, "zero": 1}, r"zero_group=4 with zero=1; HSDP groups shard ZeRO-2/3 state"),
    ({"zero_group": 4, "dp": 6}, r"zero_group=4 with dp=6; a shard group must be smaller than dp and divide it"),
    (["tp", 2], r"fixed must be a dict"),
])
def test_pins_alone_get_their_own_message(fixed, message) -> None:
    with pytest.raises(ir.PlanError, match=message):
        check_fixed(fixed)


# --- pins against the request (solver/pins.py) -------------------------------------------------------

def _fit(fixed, dims=DENSE, *, world=8, domain=8, global_batch=8, seq_len=4096, name="llama3-8b") -> None:
    check_pins_fit(dims, world=world, domain=domain, global_batch=global_batch, seq_len=seq_len,
                   fixed=check_fixed(fixed), runtime=RUNTIME, model_name=name)


@pytest.mark.parametrize("fixed, kw, message", [
    ({"ep": 2}, {}, r"ep=2 needs a model with experts; llama3-8b has none"),
    ({"ep": 3}, {"dims": MOE, "name": "mixtral"}, r"ep=3 does not divide the 8 experts of mixtral"),
    ({"ep": 4, "dp": 2}, {"dims": MOE}, r"ep=4 does not divide dp=2"),
    ({"tp": 3}, {"world": 24}, r"tp=3 does not divide heads \(32\), kv_heads \(8\), ffn \(14336\)"),
    ({"tp": 16}, {"world": 16}, r"tp=16 exceeds the scale-up domain of 8 GPUs .*; pin tp in \[1, 2, 4, 8\]"),
    ({"tp": 4, "pp": 4}, {}, r"pp\(4\) \* tp\(4\) = 16 does not divide the 8 GPUs"),
    ({"tp": 2, "pp": 1, "dp": 2, "cp": 1}, {}, r"= 4 != 8 GPUs"),
    ({"dp": 3}, {}, r"fixed: dp=3 does not divide the 8 GPUs \(8 % 3 = 2\)"),
    ({"cp": 8}, {"seq_len": 2048}, r"cp=8 leaves 256 tokens per rank"),
    ({"pp": 64}, {"world": 64}, r"pp=64 exceeds the 32 layers of llama3-8b"),
    ({"vp": 18}, {}, r"vp=18 needs at least pp\(2\) \* vp\(18\) - 2 = 34 layers"),
    ({"pp": 4, "vp": 16}, {}, r"pp\(4\) \* vp\(16\) = 64 chunks but llama3-8b has 32 layers"),
    ({"vp": 2}, {"world": 1}, r"vp=2 needs pp > 1 but the cluster has 1 GPU"),
    ({"dp": 3}, {"world": 3, "global_batch": 8}, r"dp=3 does not divide the global batch 8"),
    ({"micro_batch": 3}, {}, r"micro_batch=3 does not divide the global batch 8"),
    ({"micro_batch": 4, "num_microbatches": 4}, {}, r"= 16 does not divide the global batch 8"),
    ({"dp": 2, "micro_batch": 2, "num_microbatches": 1}, {}, r"= 4 != global batch 8"),
    ({"zero_group": 8}, {}, r"zero_group=8 needs a data-parallel degree that is a multiple of it, larger than it"),
    ({"zero_group": 3}, {}, r"zero_group=3 needs a data-parallel degree .* divides the 8 GPUs"),
])
def test_pins_against_the_request_get_their_own_message(fixed, kw, message) -> None:
    with pytest.raises(ir.InfeasibleError, match=message):
        _fit(fixed, **kw)


def test_a_pinned_zero_group_is_the_only_one_offered_and_programs_without_hsdp_refuse_it() -> None:
    """``zero_group`` pins HSDP's shard group (0: all of dp, as Megatron-FSDP and DeepSpeed shard): the search
    offers that group alone; a program that runs no HSDP (Megatron-Core's) refuses a group > 1, naming it."""
    from meshplan.solver.space import MEGATRON

    offered = {c.zero_group for c in candidates(DENSE, world=8, domain=8, global_batch=8, seq_len=4096,
                                                fixed=check_fixed({"zero": 3}))}
    assert {0, 2, 4} <= offered
    for g in (0, 4):
        pinned = candidates(DENSE, world=8, domain=8, global_batch=8, seq_len=4096,
                            fixed=check_fixed({"zero": 3, "zero_group": g}))
        assert pinned and {c.zero_group for c in pinned} == {g}
    assert check_fixed({"zero_group": 0}, MEGATRON) == {"zero_group": 0}
    with pytest.raises(ir.PlanError, match=r"zero_group=4, but this program shards ZeRO state over all of dp"):
        check_fixed({"zero_group": 4}, MEGATRON)


def test_pins_that_fit_pass_and_leave_candidates() -> None:
    fixed = {"tp": 2, "pp": 2, "vp": 2, "micro_batch": 1}
    _fit(fixed)
    assert candidates(DENSE, world=8, domain=8, global_batch=8, seq_len=4096, fixed=check_fixed(fixed))


def test_a_pinned_vp_outside_the_searched_ones_is_offered_not_dropped() -> None:
    """``--vp 3`` was silently dropped when the search tried only vp in (2, 4); a vp it does not try (7) is offered."""
    from meshplan.solver.space import VIRTUAL_STAGES
    assert 7 not in VIRTUAL_STAGES
    found = candidates(DENSE, world=8, domain=8, global_batch=8, seq_len=4096, fixed=check_fixed({"vp": 7}))
    assert found and {c.vp for c in found} == {7}
    assert all(c.pp > 1 and c.schedule == ir.Schedule.INTERLEAVED_1F1B for c in found)


def test_a_pinned_microbatch_count_beyond_the_search_cap_is_offered() -> None:
    found = candidates(DENSE, world=1, domain=8, global_batch=4096, seq_len=64, fixed={"num_microbatches": 2048})
    assert found and {(c.micro_batch, c.num_microbatches) for c in found} == {(2, 2048)}


# --- the request as the solver sees it ---------------------------------------------------------------

def _request(**kw) -> Request:
    base = dict(graph=SimpleNamespace(dims=DENSE), cluster=Cluster.preset("h100-sxm", nodes=1, gpus_per_node=8),
                model={"name": "llama3-8b"}, global_batch=8, seq_len=1024)
    return Request(**{**base, **kw})


@pytest.mark.parametrize("kw, message", [
    (dict(time_limit_s=float("nan")), r"time_limit_s must be a positive, finite number .* got nan"),
    (dict(time_limit_s=-1.0), r"got -1.0"),
    (dict(time_limit_s=0), r"got 0.0"),
    (dict(global_batch=2**63), r"global_batch 9223372036854775808 exceeds the limit .*2\^40"),
    (dict(seq_len=2**30), r"seq_len 1073741824 exceeds the limit .*2\^24"),
    (dict(graph=SimpleNamespace(dims=ir.ModelDims(family="llama", layers=10**6, hidden=64, heads=4, kv_heads=4,
                                                    ffn_hidden=256, vocab=512))), r"layers 1000000 exceeds"),
    (dict(fixed={"ep": 2}), r"ep=2 needs a model with experts; llama3-8b has none"),
    (dict(fixed={"tp": 1, "sp": True}), r"sp needs tp > 1"),
])
def test_the_solver_refuses_bad_requests_before_any_search(kw, message) -> None:
    with pytest.raises(ir.PlanError, match=message):
        check_request(_request(**kw))


def test_the_solver_refuses_a_cluster_beyond_the_gpu_limit() -> None:
    """``Cluster`` refuses one itself (cost_model); the solver does not rely on it: any object with a
    world size beyond the limit is refused before its divisors are taken."""
    with pytest.raises(ir.InvalidClusterError, match="exceeds the limit of 10000000"):
        Cluster.preset("h100-sxm", nodes=2_000_000, gpus_per_node=8)
    huge = SimpleNamespace(world_size=16_000_000, name="h100-sxm")
    with pytest.raises(ir.PlanError, match=r"world size 16000000 exceeds the limit of 10000000 \(10\^7\) GPUs"):
        check_request(_request(cluster=huge))


# --- loops over layers and ranks are linear -----------------------------------------------------------

def _recompute_reference(layers, stages, pp, selective, full):
    out = [ir.Recompute.NONE] * layers
    for rank in range(pp):
        mine = [i for c, (a, b) in enumerate(stages or ((0, layers),)) if c % pp == rank for i in range(a, b)]
        for j, i in enumerate(mine):
            out[i] = (ir.Recompute.FULL if j < full else ir.Recompute.SELECTIVE if j < full + selective
                      else ir.Recompute.NONE)
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(pp=st.integers(1, 6), vp=st.integers(1, 3), extra=st.integers(0, 20), data=st.data())
def test_recompute_list_matches_the_per_rank_walk(pp, vp, extra, data) -> None:
    chunks = pp * vp
    counts = [1 + data.draw(st.integers(0, 4)) for _ in range(chunks)]
    bounds = [0, *[sum(counts[:i + 1]) for i in range(chunks)]]
    stages = tuple(zip(bounds[:-1], bounds[1:])) if pp > 1 else ()
    layers = bounds[-1]
    full, selective = data.draw(st.integers(0, layers)), data.draw(st.integers(0, layers))
    assert recompute_list(layers, stages, pp, selective, full) == _recompute_reference(layers, stages, pp,
                                                                                       selective, full)
    per_rank = max(sum(b - a for c, (a, b) in enumerate(stages) if c % pp == r) for r in range(pp)) \
        if stages else layers
    assert layers_per_rank(stages, pp, layers) == per_rank


def test_recompute_list_is_linear_in_the_layers() -> None:
    """pp = 10^5 single-layer stages: the old walk (one pass over every chunk per rank) took 10^10 steps.
    10^5 is past limits.MAX_LAYERS, so that a quadratic walk would show."""
    n = 10**5
    stages = tuple((i, i + 1) for i in range(n))
    with within(20):
        out = recompute_list(n, stages, n, 0, 1)
        assert layers_per_rank(stages, n, n) == 1
    assert out == (ir.Recompute.FULL,) * n
    assert math.isclose(len(out), n)
