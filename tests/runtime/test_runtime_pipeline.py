"""Pipeline parallelism on gloo: each pipelined plan trains 3 AdamW steps on 2, 4 or 8 CPU processes
and must match one process training the same model on the same data (losses and final parameters,
fp32, 1e-5); and each rank must hold exactly its stages.

One launch per world size runs every case in the same processes (a gloo start costs seconds)."""
from __future__ import annotations

import pytest

from parity_support import assert_matches_reference, launch
from pipeline_cases import megatron_stages, pipeline_plan

FULL, SEL = ("full",) * 4, ("selective",) * 4

CASES_8 = [  # pp=2 x dp=2 x tp=2 (or cp=2)
    dict(name="llama 1f1b zero3 sp recompute", model="llama-tiny",
         plan=dict(pp=2, dp=2, tp=2, sp=True, zero=3, recompute=("full", "none", "selective", "none"))),
    dict(name="gpt interleaved vp2 zero0 sp", model="gpt-tiny",
         plan=dict(pp=2, dp=2, tp=2, sp=True, schedule="interleaved-1f1b", vp=2)),
    dict(name="llama zero-bubble zero2 no-sp", model="llama-tiny",
         plan=dict(pp=2, dp=2, tp=2, zero=2, schedule="zero-bubble")),
    # pp x cp x ep: each stage's experts over the dp ranks of one cp rank, data-parallel over edp x cp
    dict(name="moe pp2 x dp2 x cp2 ep2 zero2", model="moe-tiny", plan=dict(pp=2, dp=2, cp=2, ep=2, zero=2)),
]
CASES_4 = [
    # the schedules on pp=4 (1F1B needs at least pp micro-batches)
    dict(name="gpt pp4 gpipe", model="gpt-tiny", plan=dict(pp=4, schedule="gpipe")),
    dict(name="llama pp4 1f1b uneven", model="llama-tiny",
         plan=dict(pp=4, nmb=4, layers=6, stages=((0, 2), (2, 3), (3, 4), (4, 6)))),
    dict(name="llama pp4 interleaved vp2", model="llama-tiny",
         plan=dict(pp=4, nmb=4, schedule="interleaved-1f1b", vp=2, layers=8)),
    # Llama 3.1 405B's layout in small (126 layers on pp 16 x vp 8): 6 layers on pp 4 x vp 2 = 8 chunks,
    # Megatron's first/last stage one layer lighter: chunk 0 the embedding alone, chunk 7 the head alone
    dict(name="llama pp4 vp2 megatron uneven 6 layers", model="llama-tiny",
         plan=dict(pp=4, nmb=4, schedule="interleaved-1f1b", vp=2, layers=6,
                   stages=megatron_stages(6, 4, 2, first=1, last=1))),
    dict(name="gpt pp4 zero-bubble", model="gpt-tiny", plan=dict(pp=4, nmb=4, schedule="zero-bubble")),
    # pp x dp with each ZeRO stage the runtime runs under pipelining, pp x tp
    dict(name="gpt pp2 dp2 zero0 1f1b", model="gpt-tiny", plan=dict(pp=2, dp=2)),
    dict(name="llama pp2 dp2 zero2 zero-bubble full", model="llama-tiny",
         plan=dict(pp=2, dp=2, zero=2, schedule="zero-bubble", recompute=FULL)),
    dict(name="llama pp2 dp2 zero3 interleaved", model="llama-tiny",
         plan=dict(pp=2, dp=2, zero=3, schedule="interleaved-1f1b", vp=2)),
    # --compile under pipelining (each block's forward compiled before the split; codegen.options.compile_refusal
    # refuses it with the zero-bubble schedule)
    dict(name="llama pp2 dp2 zero2 1f1b compiled", model="llama-tiny", plan=dict(pp=2, dp=2, zero=2), compile=True),
    dict(name="gpt pp2 tp2 sp gpipe selective", model="gpt-tiny",
         plan=dict(pp=2, tp=2, sp=True, schedule="gpipe", recompute=SEL)),
    # pp x ep: each stage's experts split over the ep ranks of that stage (its dp ranks)
    dict(name="moe pp2 dp2 ep2 zero2 1f1b", model="moe-tiny", plan=dict(pp=2, dp=2, ep=2, zero=2)),
    # zero bubble defers each stage's weight gradients past the input gradients, through the experts' all-to-all
    dict(name="moe pp2 dp2 ep2 zero2 zero-bubble", model="moe-tiny",
         plan=dict(pp=2, dp=2, ep=2, zero=2, nmb=4, schedule="zero-bubble")),
    dict(name="moe pp2 dp2 ep2 zero0 interleaved full", model="moe-tiny",
         plan=dict(pp=2, dp=2, ep=2, schedule="interleaved-1f1b", vp=2, recompute=FULL)),
    # pp x cp: each rank cuts its tokens before the schedule; every stage runs on them and hands them on
    dict(name="llama pp2 cp2 zero2 1f1b", model="llama-tiny", plan=dict(pp=2, cp=2, zero=2)),
    # GPT's learned positions are added on the first stage (ContextParallel(embed)); plain DP over dp x cp
    dict(name="gpt pp2 cp2 zero0 interleaved selective", model="gpt-tiny",
         plan=dict(pp=2, cp=2, schedule="interleaved-1f1b", vp=2, recompute=SEL)),
]
CASES_2 = [
    dict(name="gpt gpipe full", model="gpt-tiny", plan=dict(pp=2, schedule="gpipe", recompute=FULL)),
    dict(name="llama interleaved uneven", model="llama-tiny",
         plan=dict(pp=2, nmb=4, schedule="interleaved-1f1b", vp=2, layers=6, stages=((0, 1), (1, 3), (3, 4), (4, 6)))),
    dict(name="moe 1f1b uneven", model="moe-tiny", plan=dict(pp=2, stages=((0, 3), (3, 4)))),
]


def _launch(tmp_path_factory, world_size: int, cases: list[dict]) -> list[dict]:
    return launch(tmp_path_factory, world_size, "pipeline_cases:run_cases", {"cases": cases})


@pytest.fixture(scope="module")
def ranks8(tmp_path_factory) -> list[dict]:
    return _launch(tmp_path_factory, 8, CASES_8)


@pytest.fixture(scope="module")
def ranks4(tmp_path_factory) -> list[dict]:
    return _launch(tmp_path_factory, 4, CASES_4)


@pytest.fixture(scope="module")
def ranks2(tmp_path_factory) -> list[dict]:
    return _launch(tmp_path_factory, 2, CASES_2)


def _check_parity(ranks: list[dict], case: dict) -> None:
    assert_matches_reference(ranks, case["name"], pipeline_plan(case["model"], **case["plan"]).model)


SCHEDULE_CLASS = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
                  "zero-bubble": "ScheduleInterleavedZeroBubble"}


def _check_holdings(ranks: list[dict], case: dict) -> None:
    """Each rank holds its stages (c % pp == its pp rank) and their layers only; the embedding on
    the first stage's rank, the head on the last's; parameters divided by tp, and by dp for ZeRO-2/3."""
    plan = pipeline_plan(case["model"], **case["plan"])
    pp, tp, zero = plan.mesh.pp, plan.mesh.tp, plan.zero_stage
    dp = plan.mesh.dp * plan.mesh.cp  # cp ranks see other tokens: data-parallel too
    edp = plan.mesh.dp // plan.mesh.ep  # the replicas of an expert shard
    total = sum(t.numel() for t in ranks[0][case["name"]]["params"].values())
    held_numel = {}
    for result in (r[case["name"]] for r in ranks):
        ids = tuple(range(result["pp_rank"], len(plan.stages), pp))
        assert result["stage_ids"] == ids and result["schedule"] == SCHEDULE_CLASS[plan.schedule]
        assert result["layers"] == [i for c in ids for i in range(*plan.stages[c])]
        assert result["parts"] == (["embed"] if 0 in ids else []) + (["norm", "output"] if len(plan.stages) - 1 in ids
                                                                    else [])
        assert result["checkpointed"] == sum(plan.recompute[i] != "none" for i in result["layers"])
        assert (result["dtensors"] > 0) == (tp > 1 or dp > 1)
        assert (result["expert_numel"] > 0) == (plan.mesh.ep > 1 and bool(result["layers"]))
        held_numel.setdefault(result["pp_rank"], []).append((result["local_numel"], result["expert_numel"]))
    # a pp rank's dp * tp processes each hold 1/tp of its stages (norms and a few biases stay whole),
    # and 1/dp of that under ZeRO-2/3; its experts 1/ep, and 1/edp of that under ZeRO-2/3: the pp ranks'
    # holdings add up to the model once
    whole = 0.0
    for numels in held_numel.values():
        local, experts = sum(n for n, _ in numels), sum(e for _, e in numels)
        whole += (local - experts) * (dp if zero >= 2 else 1) / dp + experts / (1 if zero >= 2 else edp)
    assert 0.98 * total <= whole <= 1.15 * total


def _ids(cases: list[dict]) -> list[str]:
    return [c["name"] for c in cases]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_8, ids=_ids(CASES_8))
def test_pp_dp_tp_on_eight_processes_matches_one(ranks8, case) -> None:
    _check_parity(ranks8, case)
    _check_holdings(ranks8, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_4, ids=_ids(CASES_4))
def test_schedules_and_compositions_on_four_processes_match_one(ranks4, case) -> None:
    _check_parity(ranks4, case)
    _check_holdings(ranks4, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_2, ids=_ids(CASES_2))
def test_two_stages_match_one(ranks2, case) -> None:
    _check_parity(ranks2, case)
    _check_holdings(ranks2, case)


@pytest.mark.slow
def test_dp_rank_under_pipelining(ranks8) -> None:
    """Mesh (pp, dp, tp), tp innermost: ranks 0-3 are pp rank 0, and dp rank alternates every two ranks."""
    got = [(r["llama 1f1b zero3 sp recompute"]["pp_rank"], r["llama 1f1b zero3 sp recompute"]["dp_rank"])
           for r in ranks8]
    assert got == [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0), (1, 1), (1, 1)]


def test_a_stand_in_block_carries_the_plain_attributes_a_model_forward_reads() -> None:
    """Nemotron-H's forward reads ``layer.block_type`` off every layer, those another stage holds too: their stand-ins
    carry the block's strings, numbers and booleans (not its tensors, modules or nn.Module's own state); before, pp2
    stopped with "'StopBlock' object has no attribute 'block_type'"."""
    import torch
    from torch import nn

    from meshplan.runtime.pipeline import StopBlock, _carry_plain_attrs

    block = nn.Linear(2, 2).eval()
    block.block_type, block.layer_idx, block.scale, block.window, block.table = "mamba", 3, 0.5, None, torch.ones(2)
    stand_in = StopBlock("model.layers.3")
    _carry_plain_attrs(stand_in, block)
    assert (stand_in.block_type, stand_in.layer_idx, stand_in.scale, stand_in.window) == ("mamba", 3, 0.5, None)
    assert stand_in.path == "model.layers.3" and stand_in.training and not hasattr(stand_in, "table")
    assert not list(stand_in.parameters())
