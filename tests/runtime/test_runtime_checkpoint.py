"""Checkpoints on gloo: saved under one plan after 2 steps, loaded under another plan (other degrees,
other ZeRO stage) into a model with other initial weights, trained 2 more steps: the losses and
final parameters equal one process training 4 steps without a break (fp32, 1e-5). A checkpoint
of another model names the parameters that differ. And ``meshplan run`` with a crash injected at
step 3 and ``--max-restarts 1`` ends where an uninterrupted run ends."""
from __future__ import annotations

import re

import pytest
import torch

from meshplan import ir
from meshplan.codegen import lower

from checkpoint_cases import TOTAL, plan_for
from parity_support import reference, run_ranks
from run_support import finish, losses_of, start

pytestmark = pytest.mark.slow

SAVES = {
    "gpt dp4 zero0": dict(model="gpt-tiny", plan=dict(dp=4)),
    "gpt dp4 zero1": dict(model="gpt-tiny", plan=dict(dp=4, zero=1)),
    "llama dp4 zero3": dict(model="llama-tiny", plan=dict(dp=4, zero=3, recompute=("full",) * 4)),
    "moe dp4 ep2 zero2": dict(model="moe-tiny", plan=dict(dp=4, ep=2, zero=2)),
}
LOADS = [
    dict(name="zero0 -> dp2 x tp2 sp zero3", save="gpt dp4 zero0", plan=dict(dp=2, tp=2, sp=True, zero=3)),
    dict(name="zero1 -> dp2 x tp2 zero2", save="gpt dp4 zero1", plan=dict(dp=2, tp=2, zero=2, nmb=2)),
    dict(name="zero0 -> dp4 zero1", save="gpt dp4 zero0", plan=dict(dp=4, zero=1)),
    dict(name="llama zero3 -> dp2 x tp2 sp zero0", save="llama dp4 zero3", plan=dict(dp=2, tp=2, sp=True)),
    dict(name="llama zero3 -> pp2 x tp2 sp", save="llama dp4 zero3", plan=dict(pp=2, tp=2, sp=True, nmb=2)),
    dict(name="llama zero3 -> dp2 x tp2 sp, MLPs whole over tp", save="llama dp4 zero3",
         plan=dict(dp=2, tp=2, sp=True, replicate=("mlp",))),
    # the experts (and their AdamW state) of 2 ep ranks over dp 4, resumed on 2 stages of 2 ep ranks each
    dict(name="moe ep2 zero2 -> pp2 x dp2 ep2 zero0", save="moe dp4 ep2 zero2", plan=dict(pp=2, dp=2, ep=2, nmb=2)),
]


def _runs(case: dict) -> bool:
    """Whether the runtime executes the case's plan (pipeline parallelism may not be there yet)."""
    try:
        lower(plan_for(SAVES[case["save"]]["model"], **case["plan"]))
    except ir.InvalidPlanError:
        return False
    return True


LOADS = [case for case in LOADS if _runs(case)]


_REFERENCES: dict[str, tuple] = {}


def _reference(model: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    if model not in _REFERENCES:
        _REFERENCES[model] = reference(model, steps=TOTAL)
    return _REFERENCES[model]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("checkpoint4")
    run_ranks(4, "checkpoint_cases:run_cases", {"saves": SAVES, "loads": LOADS, "errors": True}, tmp)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(4)]


@pytest.mark.parametrize("case", LOADS, ids=[c["name"] for c in LOADS])
def test_a_checkpoint_loads_under_another_plan_and_training_continues(ranks, case) -> None:
    model = SAVES[case["save"]]["model"]
    ref_losses, ref_params = _reference(model)
    saved = ranks[0][case["save"]]["losses"]
    got = ranks[0][case["name"]]
    assert got["step"] == 2 and got["steps_done"] == TOTAL
    assert all(r[case["name"]]["losses"] == got["losses"] for r in ranks)
    torch.testing.assert_close(torch.tensor(saved + got["losses"]), torch.tensor(ref_losses), atol=1e-5, rtol=1e-5)
    assert sorted(got["params"]) == sorted(ref_params)
    for name, ref in ref_params.items():
        torch.testing.assert_close(got["params"][name], ref, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_a_checkpoint_of_another_model_names_the_parameters(ranks) -> None:
    errors = ranks[0]["errors"]
    assert re.search(r"'embed\.tok\.weight' has shape \(256, 64\) in the model but \(512, 64\) in the checkpoint",
                     errors["other vocab"]), errors["other vocab"]
    assert "is not in the checkpoint" in errors["other family"], errors["other family"]
    assert "no complete checkpoint" in errors["missing"] and "does not exist" in errors["missing"]


def test_meshplan_run_recovers_from_a_crash_with_the_same_result(straight_run, tmp_path) -> None:
    """Against the uninterrupted run of the same plan (conftest.straight_run, shared with the fault tests)."""
    assert sorted(straight_run.losses) == list(range(1, TOTAL + 1)), straight_run.out
    assert "median step time" in straight_run.out
    crash = {"MESHPLAN_FAIL_AT_STEP": "3", "MESHPLAN_FAIL_RANK": "1"}
    ckpt, final = tmp_path / "ckpt", tmp_path / "crashed.pt"
    code, out, err = finish(start(straight_run.plan_path, "--save-final", str(final), "--checkpoint-every", "2",
                                  "--max-restarts", "1", "--checkpoint-dir", str(ckpt), env=crash), timeout_s=240)
    assert code == 0, out + err
    got_losses = losses_of(out)
    assert sorted(got_losses) == list(range(1, TOTAL + 1)), out
    assert "median step time" in out
    assert "injected failure before step 3" in out and "at step 2" in out, out
    assert got_losses == pytest.approx(straight_run.losses, abs=1e-5)
    got_params = torch.load(final)
    for name, ref in straight_run.params.items():
        torch.testing.assert_close(got_params[name], ref, atol=1e-6, rtol=1e-6, msg=lambda m: f"{name}: {m}")
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-000002", "step-000004"]
