"""Uneven pipeline layouts: Megatron-LM's first/last-stage and account-for-embedding/loss rule, the
cost-model balanced split under interleaving, and what the search and the plan accept.

Llama 3.1 405B (Dubey et al. 2024, Table 3: 126 layers) runs ``pp 16 x vp 8`` with one layer fewer
on the first and the last stage (sec. 3.3.2): 128 chunks for 126 layers, chunk 0 the embedding
alone, chunk 127 the head alone."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import ir, zoo
from meshplan.solver.space import candidates
from meshplan.solver.stages import (balanced, chunks_of_ranks, megatron_counts, output_extra_layers, rank_minimum,
                                    stage_ranges)

L405 = zoo.config("llama3-405b")
DIMS_405B = ir.ModelDims(family="llama", layers=L405.layers, hidden=L405.hidden, heads=L405.heads,
                         kv_heads=L405.kv_heads, ffn_hidden=L405.ffn_hidden, vocab=L405.vocab)


def per_rank(counts: tuple[int, ...], pp: int) -> list[int]:
    return [sum(counts[c] for c in range(r, len(counts), pp)) for r in range(pp)]


def test_405b_megatron_flags_give_llama3s_layout() -> None:
    by_flags = megatron_counts(126, 16, 8, first=7, last=7)
    by_accounting = megatron_counts(126, 16, 8, embedding=True, loss=True)
    assert by_flags == by_accounting
    assert len(by_flags) == 128 and sum(by_flags) == 126
    assert by_flags[0] == 0 and by_flags[-1] == 0 and set(by_flags[1:-1]) == {1}
    assert per_rank(by_flags, 16) == [7] + [8] * 14 + [7]


def test_megatron_rule_where_it_divides() -> None:
    """32 layers, pp 4 x vp 2, first 6 / last 6: middle ranks 10 each, every rank's layers halved over its
    chunks (Megatron's get_num_layers_to_build); without interleaving the ranks hold 6, 10, 10, 6."""
    assert megatron_counts(32, 4, 2, first=6, last=6) == (3, 5, 5, 3, 3, 5, 5, 3)
    assert megatron_counts(32, 4, 1, first=6, last=6) == (6, 10, 10, 6)
    assert megatron_counts(32, 4, 1, last=5) == (9, 9, 9, 5)
    # account-for: 32 + 2 = 34 slots on 2 ranks: 17 each, the embedding and the loss take one
    assert megatron_counts(32, 2, 1, embedding=True, loss=True) == (16, 16)
    assert megatron_counts(30, 2, 2, embedding=True) == (7, 8, 8, 7)


def test_tiny_analogue_of_405b() -> None:
    """6 layers on pp 4 x vp 2 (8 chunks): the same rule, first and last rank one layer lighter."""
    counts = megatron_counts(6, 4, 2, first=1, last=1)
    assert counts == megatron_counts(6, 4, 2, embedding=True, loss=True) == (0, 1, 1, 1, 1, 1, 1, 0)
    assert per_rank(counts, 4) == [1, 2, 2, 1]


@pytest.mark.parametrize("kw, message", [
    (dict(layers=126, pp=16, vp=8), r"128 chunks but the model has 126 layers; pass fewer chunks or account"),
    (dict(layers=10, pp=4, vp=1, first=8, last=1), r"leave 1 of the 10 layers for 2 middle rank"),
    (dict(layers=126, pp=16, vp=8, first=7, embedding=True), r"two ways to say the same thing"),
    (dict(layers=126, pp=16, vp=8, first=6), r"first stage layers\(6\) must be an integer >= 7"),
    (dict(layers=8, pp=1, vp=1, first=4), r"need pp > 1"),
])
def test_bad_megatron_layouts_say_why(kw, message) -> None:
    with pytest.raises(ir.InvalidPlanError, match=message):
        megatron_counts(kw.pop("layers"), kw.pop("pp"), kw.pop("vp"), **kw)


def test_balanced_405b_is_llama3s_layout_from_the_flops() -> None:
    """The output layer is 0.66 of a layer in FLOPs: the balanced split takes a layer off the last rank
    and, to cover 126 layers with 16 ranks of at most 8, one off the first: Dubey et al.'s layout."""
    assert 0.6 < output_extra_layers(DIMS_405B) < 0.7
    ranges = stage_ranges(DIMS_405B, 16, 8)
    counts = tuple(b - a for a, b in ranges)
    assert counts == megatron_counts(126, 16, 8, first=7, last=7)
    assert per_rank(counts, 16) == [7] + [8] * 14 + [7]
    assert ranges[0] == (0, 0) and ranges[-1] == (126, 126)
    assert [b - a for a, b in stage_ranges(DIMS_405B, 16, 1)] == [7] + [8] * 14 + [7]


def test_balanced_follows_the_vocabulary() -> None:
    """A small vocabulary leaves the stages even; a large one lightens the last rank by more layers."""
    small = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=1024)
    large = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                         vocab=256000)
    assert per_rank(tuple(b - a for a, b in stage_ranges(small, 4, 2)), 4) == [8, 8, 8, 8]
    heavy = per_rank(tuple(b - a for a, b in stage_ranges(large, 4, 2)), 4)
    assert heavy[-1] < 8 and sum(heavy) == 32 and max(heavy) - heavy[-1] >= 2


@settings(max_examples=150, deadline=None)
@given(layers=st.integers(2, 14), pp=st.integers(2, 4), vp=st.integers(1, 3),
       extra=st.floats(0.0, 3.0, allow_nan=False))
def test_balanced_minimizes_the_slowest_rank(layers, pp, vp, extra) -> None:
    """Against brute force over every split that respects the minimums."""
    low = rank_minimum(pp, vp)
    if layers < sum(low):
        return
    loads = (0.0,) * (pp - 1) + (extra,)
    got = balanced(layers, loads, low)
    assert sum(got) == layers and all(n >= m for n, m in zip(got, low))
    best = min(max(n + e for n, e in zip(split, loads))
               for split in itertools.product(*(range(m, layers + 1) for m in low)) if sum(split) == layers)
    assert max(n + e for n, e in zip(got, loads)) == pytest.approx(best)
    counts = chunks_of_ranks(got, vp)
    assert per_rank(counts, pp) == list(got)
    assert all(n >= 1 for n in counts[1:-1])  # only chunk 0 and the last may be empty


def test_plan_accepts_only_end_chunks_empty() -> None:
    cfg = zoo.config("llama-tiny", layers=6).to_dict()

    def plan(stages):
        return ir.Plan(model=cfg, cluster="cpu:1x4", global_batch=8, seq_len=16, mesh=ir.Mesh(pp=4),
                       micro_batch_size=2, num_microbatches=4, schedule="interleaved-1f1b", vp=2,
                       stages=stages, recompute=("none",) * 6)

    counts = megatron_counts(6, 4, 2, first=1, last=1)
    bounds = [0, *itertools.accumulate(counts)]
    assert plan(tuple(zip(bounds[:-1], bounds[1:]))).stages[0] == (0, 0)
    with pytest.raises(ir.PlanError, match="only the first and last may be empty"):
        plan(((0, 1), (1, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 6)))


def test_search_offers_more_chunks_than_layers_by_two() -> None:
    """6 layers on 4 GPUs: pp 4 x vp 2 = 8 chunks is offered (the end chunks hold the embedding and the
    head), pp 4 x vp 4 = 16 is not."""
    dims = ir.ModelDims(family="llama", layers=6, hidden=64, heads=4, kv_heads=2, ffn_hidden=160, vocab=512)
    found = {(c.pp, c.vp) for c in candidates(dims, world=4, domain=4, global_batch=8, seq_len=16, fixed={})
             if c.schedule == ir.Schedule.INTERLEAVED_1F1B}
    assert (4, 2) in found and (4, 4) not in found and (2, 4) in found
