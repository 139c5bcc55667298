"""The integer program against brute force on small random problems."""
from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.solver import ilp

costs = st.builds(
    ilp.CandidateCost, layers=st.integers(1, 6),
    time_s=st.floats(0.1, 10), memory_bytes=st.floats(1e9, 100e9),
    extra_time_s=st.tuples(st.floats(0.001, 0.2), st.floats(0.01, 0.5)),
    saved_bytes=st.tuples(st.floats(0, 1e9), st.floats(0, 3e9)),
)


def brute_force(p: ilp.Problem) -> float | None:
    best = None
    for c, cost in enumerate(p.costs):
        for sel, full in itertools.product(range(cost.layers + 1), repeat=2):
            if sel + full > cost.layers:
                continue
            mem = cost.memory_bytes - sel * cost.saved_bytes[0] - full * cost.saved_bytes[1]
            if round(mem / 1024) > round(p.memory_limit_bytes / 1024):
                continue
            t = cost.time_s + sel * cost.extra_time_s[0] + full * cost.extra_time_s[1]
            best = t if best is None else min(best, t)
    return best


@settings(max_examples=40, deadline=None)
@given(st.lists(costs, min_size=1, max_size=5), st.floats(5e9, 80e9))
def test_optimum_equals_brute_force(cost_list, limit) -> None:
    p = ilp.Problem(costs=tuple(cost_list), memory_limit_bytes=limit)
    sol = ilp.solve(p, time_limit_s=10)
    expect = brute_force(p)
    if expect is None:
        assert sol.candidate == -1 and sol.status == "INFEASIBLE"
    else:
        assert sol.status == "OPTIMAL" and sol.gap == 0.0
        assert abs(sol.objective_s - expect) <= 1e-5 * 6 * 3 + 1e-5  # µs rounding per term


offload_costs = st.builds(
    ilp.CandidateCost, layers=st.integers(1, 6),
    time_s=st.floats(0.1, 10), memory_bytes=st.floats(1e9, 100e9),
    extra_time_s=st.tuples(st.floats(0.001, 0.2), st.floats(0.01, 0.5), st.floats(0.001, 0.3)),
    saved_bytes=st.tuples(st.floats(0, 1e9), st.floats(0, 3e9), st.floats(0, 3e9)),
    offload_alone=st.booleans(), offload_cap=st.none() | st.integers(0, 6),
)


@settings(max_examples=60, deadline=None)
@given(costs | offload_costs, st.floats(5e9, 80e9),
       st.sampled_from([None, None, "none", "selective", "full", "offload"]))
def test_value_bounds_hold_the_programs_optimum(cost, limit, pinned) -> None:
    """The window drops a candidate by these bounds (search._within_reach): the lower one must never exceed the
    program's optimum for the candidate alone, and the upper one must be reached by a solution that fits."""
    lower, upper = ilp.value_bounds(cost, limit, pinned)
    sol = ilp.solve(ilp.Problem(costs=(cost,), memory_limit_bytes=limit, pinned_recompute=pinned), time_limit_s=10)
    if sol.candidate < 0:
        assert sol.status == "INFEASIBLE" and upper == float("inf")
    else:
        assert lower <= sol.objective_s + 1e-5 * 4 and sol.objective_s <= upper + 1e-5 * 4  # µs rounding per term


def test_memory_tight_problem_turns_recompute_on() -> None:
    fast_but_big = ilp.CandidateCost(time_s=1.0, memory_bytes=90e9, extra_time_s=(0.01, 0.03),
                                     saved_bytes=(1e9, 3e9), layers=10)
    p = ilp.Problem(costs=(fast_but_big,), memory_limit_bytes=80e9)
    sol = ilp.solve(p)
    assert sol.candidate == 0
    sel, full = sol.recompute_layers
    assert sel * 1e9 + full * 3e9 >= 10e9  # saves at least the 10 GB it is over
    # cheapest mix saving 10 GB: three full (9 GB, 0.09 s) + one selective (1 GB, 0.01 s)
    assert sol.recompute_layers == (1, 3) and abs(sol.objective_s - 1.10) < 1e-6


def test_pinned_recompute_and_exclusion() -> None:
    a = ilp.CandidateCost(time_s=1.0, memory_bytes=10e9, extra_time_s=(0.01, 0.03), saved_bytes=(1e8, 3e8), layers=4)
    b = ilp.CandidateCost(time_s=2.0, memory_bytes=10e9, extra_time_s=(0.01, 0.03), saved_bytes=(1e8, 3e8),
                          layers=4)
    p = ilp.Problem(costs=(a, b), memory_limit_bytes=80e9, pinned_recompute="full")
    sol = ilp.solve(p)
    assert sol.candidate == 0 and sol.recompute_layers == (0, 4)
    sol = ilp.solve(ilp.Problem(costs=(a, b), memory_limit_bytes=80e9, excluded=frozenset({0})))
    assert sol.candidate == 1 and sol.recompute_layers == (0, 0)
