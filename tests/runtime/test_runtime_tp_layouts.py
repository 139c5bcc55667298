"""Tensor-parallel plans whose param_layouts keep a sublayer replicated over tp (the intra-op program's
"replicate" linears) run on gloo and match one process: losses and final parameters within 1e-5, and
every tp rank holds the same replicated weights (their gradients need no reduction over tp).

One launch per world size runs every case in the same processes (a gloo start costs seconds)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from meshplan import ir
from meshplan.codegen import TensorParallel, lower
from parity_support import GLOBAL_BATCH, SEQ_LEN, assert_matches_reference, launch, reference
from tp_layout_cases import layouts_plan

SEL = ("selective",) * 4
CASES_2 = [
    dict(name="llama tp2 mlp replicated", model="llama-tiny", replicate=["mlp"], plan=dict(tp=2)),
    dict(name="llama tp2 sp mlp replicated", model="llama-tiny", replicate=["mlp"], plan=dict(tp=2, sp=True)),
    dict(name="gpt tp2 attn replicated", model="gpt-tiny", replicate=["attn"], plan=dict(tp=2)),
    dict(name="gpt tp2 sp attn replicated selective", model="gpt-tiny", replicate=["attn"],
         plan=dict(tp=2, sp=True, recompute=SEL)),
    dict(name="gpt tp2 sp mlp replicated", model="gpt-tiny", replicate=["mlp"], plan=dict(tp=2, sp=True)),
    dict(name="gpt tp2 all replicated", model="gpt-tiny", replicate=["attn", "mlp"], plan=dict(tp=2)),
    dict(name="moe tp2 sp attn replicated", model="moe-tiny", replicate=["attn"], plan=dict(tp=2, sp=True)),
]
CASES_4 = [
    dict(name="llama dp2 x tp2 sp zero3 attn replicated", model="llama-tiny", replicate=["attn"],
         plan=dict(dp=2, tp=2, sp=True, zero=3)),
    dict(name="llama dp2 x tp2 sp zero0 mlp replicated", model="llama-tiny", replicate=["mlp"],
         plan=dict(dp=2, tp=2, sp=True, nmb=2)),
    dict(name="gpt dp2 x tp2 zero2 mlp replicated full", model="gpt-tiny", replicate=["mlp"],
         plan=dict(dp=2, tp=2, zero=2, recompute=("full",) * 4)),
    dict(name="gpt dp2 x tp2 sp zero0 attn replicated", model="gpt-tiny", replicate=["attn"],
         plan=dict(dp=2, tp=2, sp=True)),
    dict(name="llama cp2 x tp2 sp attn replicated", model="llama-tiny", replicate=["attn"],
         plan=dict(tp=2, sp=True, cp=2)),
    dict(name="gpt pp2 x tp2 sp mlp replicated 1f1b", model="gpt-tiny", replicate=["mlp"],
         plan=dict(pp=2, tp=2, sp=True, nmb=2)),
]


@pytest.fixture(scope="module")
def ranks2(tmp_path_factory) -> list[dict]:
    return launch(tmp_path_factory, 2, "tp_layout_cases:run_cases", {"cases": CASES_2})


def _planned() -> dict:
    """The planner's own plan where replication wins (tests/solver/test_intra_op.py checks the choice):
    gpt-tiny at dp2 x tp2 on 100 MB/s links keeps attention replicated and splits the MLP."""
    import meshplan as mp
    from meshplan.cost_model import parse_cluster

    cpu = parse_cluster("cpu:1x4")
    slow = dataclasses.replace(cpu, tiers=tuple(dataclasses.replace(t, bandwidth_Bps=1e8, collectives=())
                                                for t in cpu.tiers))
    plan = mp.autoparallelize("gpt-tiny", slow, global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, fixed={"tp": 2, "dp": 2})
    return dict(name="planner gpt dp2 x tp2", model="gpt-tiny", replicate=["attn"], plan_json=plan.to_json())


@pytest.fixture(scope="module")
def planned() -> dict:
    return _planned()


@pytest.fixture(scope="module")
def ranks4(tmp_path_factory, planned) -> list[dict]:
    return launch(tmp_path_factory, 4, "tp_layout_cases:run_cases", {"cases": CASES_4 + [planned]})


def _check(ranks: list[dict], case: dict) -> None:
    assert_matches_reference(ranks, case["name"], case["model"])
    _, ref_params = reference(case["model"])
    for rank, result in enumerate(ranks):  # replicated weights stay equal on every tp rank
        for name, ref in ref_params.items():
            torch.testing.assert_close(result[case["name"]]["params"][name], ref, atol=1e-5, rtol=1e-5,
                                       msg=lambda m: f"rank {rank} {name}: {m}")
    split = ranks[0][case["name"]]["split"]
    replicated = {lin for lin in split if lin.partition(".")[0] in case["replicate"]}
    assert replicated and not any(split[lin] for lin in replicated), split  # plain (or dp-only) weights
    assert all(split[lin] for lin in split if lin not in replicated and "router" not in lin), split


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_2, ids=[c["name"] for c in CASES_2])
def test_two_processes_match_one(ranks2, case) -> None:
    _check(ranks2, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_4, ids=[c["name"] for c in CASES_4])
def test_four_processes_match_one(ranks4, case) -> None:
    _check(ranks4, case)


@pytest.mark.slow
def test_the_planners_replicating_plan_matches_one_process(ranks4, planned) -> None:
    plan = ir.Plan.from_json(planned["plan_json"])
    assert "4 replicate" in plan.solver.intra_op and plan.mesh.tp == 2 and plan.mesh.dp == 2
    _check(ranks4, planned)


# ---- lowering, no processes ----------------------------------------------------------------------

def _block_styles(plan: ir.Plan, layer: int = 0) -> dict[str, str]:
    steps = [s for s in lower(plan).steps if isinstance(s, TensorParallel) and s.module == f"layers.{layer}"]
    return {path: str(style) for step in steps for path, style in step.plan}


def test_replicated_mlp_has_no_styles_and_sp_gathers_around_it() -> None:
    styles = _block_styles(layouts_plan("llama-tiny", ("mlp",), tp=2, sp=True))
    assert not any(path.startswith("mlp.") for path in styles)
    assert styles["mlp"] == "prepare_input_output(S(1) -> R; R -> S(1))"
    assert styles["attn.wq"].startswith("colwise") and styles["attn.wo"] == "rowwise(S(-1) -> S(1))"
    plain = _block_styles(layouts_plan("llama-tiny", ("mlp",), tp=2))
    assert set(plain) == {"attn.wq", "attn.wk", "attn.wv", "attn.wo"}  # the stream is a plain R tensor


def test_a_block_replicated_whole_without_sp_gets_no_step() -> None:
    plan = layouts_plan("gpt-tiny", ("attn", "mlp"), tp=2)
    assert [s.module for s in lower(plan).steps if isinstance(s, TensorParallel)] == [""]


def test_plans_without_layouts_keep_the_fixed_split() -> None:
    plan = layouts_plan("gpt-tiny", ("mlp",), tp=2, sp=True)
    assert lower(ir.Plan.from_json(plan.to_json())) == lower(plan)  # the layouts survive a JSON round trip
    old = lower(dataclasses.replace(plan, param_layouts={}))  # an old plan file, `meshplan estimate`
    assert old.steps == lower(layouts_plan("gpt-tiny", (), tp=2, sp=True)).steps
    assert _block_styles(dataclasses.replace(plan, param_layouts={}))["mlp.fc1"].startswith("colwise")


def test_a_half_replicated_sublayer_is_refused_with_its_placements() -> None:
    plan = layouts_plan("llama-tiny", ("mlp",), tp=2)
    layouts = dict(plan.param_layouts)
    tp = ir.AXES.index("tp")
    layouts["layers.2.mlp.w3.weight"] = tuple("S(0)" if i == tp else p for i, p in
                                              enumerate(layouts["layers.2.mlp.w3.weight"]))
    with pytest.raises(ir.InvalidPlanError, match=r"layers\.2\.mlp has tp placements mlp\.w1 R, mlp\.w3 S\(0\), mlp\.w2 R"):
        lower(dataclasses.replace(plan, param_layouts=layouts))
