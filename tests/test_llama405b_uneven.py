"""Llama 3.1 405B as Meta trained it (Dubey et al. 2024, Table 3 and sec. 3.3.2): 126 layers on
``pp 16 x vp 8``, one layer fewer on the first and the last stage. ``meshplan estimate`` takes the
layout with Megatron-LM's flags, ``meshplan plan`` (the search) finds the same layout from the cost
model, and bad layouts get one line. The zoo calls the model ``llama3-405b``; its 6-layer analogue
runs on gloo in ``tests/runtime/test_runtime_pipeline.py``."""
from __future__ import annotations

import json

import pytest

import meshplan as mp
from meshplan import cli
from meshplan.solver.stages import bounds, megatron_counts

ARGS = ("--model", "llama3-405b", "--cluster", "h100-sxm:2048x8", "--global-batch", "2048", "--seq-len", "8192",
        "--tp", "8", "--pp", "16", "--vp", "8", "--zero", "2")
LLAMA3_LAYOUT = bounds(megatron_counts(126, 16, 8, first=7, last=7))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["estimate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_takes_megatrons_first_and_last_stage_layers(capsys) -> None:
    code, out, err = run(capsys, *ARGS, "--first-stage-layers", "7", "--last-stage-layers", "7", "--json")
    assert code == 0, err
    plan = mp.Plan.from_json(out)
    assert plan.stages == LLAMA3_LAYOUT
    assert plan.stages[0] == (0, 0) and plan.stages[-1] == (126, 126)
    pred = plan.prediction
    assert pred.step_time_s > 0 and pred.time_s["bubble"] > 0 and 0.3 < pred.mfu < 0.7


@pytest.mark.parametrize("flags, message", [
    ((), "128 chunks but the model has 126 layers; the first and last chunk may hold only the embedding and the "
         "head: pass --first-stage-layers/--last-stage-layers"),
    (("--first-stage-layers", "6", "--last-stage-layers", "7"), "first stage layers(6) must be an integer >= 7"),
    (("--first-stage-layers", "7", "--account-for-embedding-in-pipeline-split"), "two ways to say the same thing"),
    (("--first-stage-layers", "7", "--stages", "1,2"), "--first-stage-layers places layers on pipeline ranks"),
])
def test_bad_uneven_layouts_get_one_line(capsys, flags, message) -> None:
    code, out, err = run(capsys, *ARGS, *flags)
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_search_finds_llama3s_layout_from_the_cost_model() -> None:
    """Pinned to Meta's degrees, the search balances the ranks by FLOPs: the output layer (0.66 of a
    layer) takes a layer off the last rank, and the first rank gives one up to cover 126 layers."""
    plan = mp.autoparallelize("llama3-405b", "h100-sxm:2048x8", global_batch=2048, seq_len=8192,
                              fixed={"pp": 16, "vp": 8, "tp": 8})
    assert plan.mesh.pp == 16 and plan.vp == 8 and plan.schedule == "interleaved-1f1b"
    assert plan.stages == LLAMA3_LAYOUT
    assert json.loads(plan.to_json())["stages"][0] == [0, 0]
