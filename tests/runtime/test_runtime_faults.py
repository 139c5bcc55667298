"""Checkpoints that cannot lie, runs that cannot hang (gloo, 4 processes in-process, then ``meshplan run``).

In one 4-process launch (``fault_cases``): an expert-parallel checkpoint loads under another ep and
under no ep, and training continues as one process would; a checkpoint with 8 bytes overwritten in
a shard, then one with a truncated ``.metadata``, is detected, named on stderr, and the previous one
is used, ending where an uninterrupted run ends; when no checkpoint verifies, the error says so.

Through ``meshplan run`` on 2 processes: a hung rank fails the step after
``--pg-timeout`` and torchrun's restart resumes with the same losses; a failed run with
``--max-restarts 0`` keeps its temporary checkpoint directory and prints the command that resumes
it, which then finishes the run; a killed torchrun agent takes its workers with it."""
from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from checkpoint_cases import SAVE_AT, TOTAL
from meshplan import zoo
from parity_support import reference, run_ranks
from run_support import finish, losses_of, start

pytestmark = pytest.mark.slow

EXPERTS = {
    "save": dict(name="moe dp4 ep2 zero3", plan=dict(dp=4, ep=2, zero=3)),
    "loads": [dict(name="-> dp4 ep4 zero0", plan=dict(dp=4, ep=4)),
              dict(name="-> dp2 x tp2 sp zero3, no ep", plan=dict(dp=2, tp=2, sp=True, zero=3))],
}
DAMAGE = {"save": dict(dp=4, zero=3), "load": dict(dp=2, tp=2, sp=True)}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("faults4")
    run_ranks(4, "fault_cases:run_cases", {"experts": EXPERTS, "damage": DAMAGE}, tmp, timeout_s=400)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(4)]


def _assert_continues(ranks: list[dict], got: list[dict], model: str, before: list[float]) -> None:
    """Every rank reports the same losses; with the ``before`` ones they and the final parameters
    equal one process training ``TOTAL`` steps."""
    ref_losses, ref_params = reference(model, steps=TOTAL)
    assert all(g["losses"] == got[0]["losses"] for g in got)
    assert got[0]["step"] == SAVE_AT
    torch.testing.assert_close(torch.tensor(before + got[0]["losses"]), torch.tensor(ref_losses), atol=1e-5, rtol=1e-5)
    assert sorted(got[0]["params"]) == sorted(ref_params)
    for name, ref in ref_params.items():
        torch.testing.assert_close(got[0]["params"][name], ref, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("case", EXPERTS["loads"], ids=[c["name"] for c in EXPERTS["loads"]])
def test_an_expert_parallel_checkpoint_loads_under_another_plan(ranks, case) -> None:
    saved = [r["experts"][EXPERTS["save"]["name"]] for r in ranks]
    _assert_continues(ranks, [r["experts"][case["name"]] for r in ranks], "moe-tiny", saved[0]["losses"])
    # the save really held a quarter of the experts per rank (ep2, then ZeRO-3 over edp 2)
    cfg = zoo.config("moe-tiny")
    expert_total = cfg.layers * cfg.experts * 3 * cfg.hidden * cfg.ffn_hidden
    assert all(s["expert_numel"] == pytest.approx(expert_total / 4, rel=0.02) for s in saved)


def test_each_checkpoint_has_a_manifest_of_its_files(ranks) -> None:
    files = ranks[0]["damage"]["files"]
    assert ".metadata" in files and "meshplan-manifest.json" in files
    assert sum(name.endswith(".distcp") for name in files) == 4


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(ranks, how) -> None:
    got = [r["damage"][how] for r in ranks]
    reason = {"flip": r"has CRC-32 [0-9a-f]{8} but [0-9a-f]{8} was written",
              "truncate": r"has \d+ bytes but \d+ were written"}[how]
    damaged = got[0]["damaged"][0]
    line = got[0]["stderr"].strip()
    assert len(line.splitlines()) == 1, line
    assert re.search(rf"step-000004 is damaged: '{re.escape(damaged)}' {reason}.*falling back to \S+step-000002$",
                     line), line
    assert all(g["stderr"] == "" for g in got[1:])  # one line from rank 0, not one per rank
    _assert_continues(ranks, got, "gpt-tiny", reference("gpt-tiny", steps=TOTAL)[0][:SAVE_AT])


def test_when_no_checkpoint_verifies_the_error_says_so(ranks) -> None:
    got = [r["damage"]["none"] for r in ranks]
    assert all(g.get("error") == got[0]["error"] for g in got)  # every rank stops with the same verdict
    error = got[0]["error"]
    assert "none of the 2 checkpoint(s)" in error and "step-000004" in error and "step-000002" in error, error
    assert "has 0 bytes but" in error, error


# ---- through meshplan run (2 processes) -----------------------------------------------------------

def _assert_same_end(straight, losses: dict[int, float], final: Path) -> None:
    assert losses == pytest.approx(straight.losses, abs=1e-5)
    params = torch.load(final)
    for name, ref in straight.params.items():
        torch.testing.assert_close(params[name], ref, atol=1e-6, rtol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.fixture()
def plan_path(straight_run) -> Path:
    """The plan of the uninterrupted run (conftest.straight_run, shared with the checkpoint tests)."""
    return straight_run.plan_path


def test_a_hung_rank_fails_the_step_and_the_restart_resumes(plan_path, straight_run, tmp_path) -> None:
    final, ckpt = tmp_path / "final.pt", tmp_path / "ckpt"
    hang = {"MESHPLAN_FAIL_AT_STEP": "3", "MESHPLAN_FAIL_RANK": "1", "MESHPLAN_FAIL_HOW": "hang"}
    began = time.monotonic()
    code, out, err = finish(start(plan_path, "--checkpoint-every", "2", "--checkpoint-dir", str(ckpt),
                                  "--max-restarts", "1", "--pg-timeout", "20", "--save-final", str(final), env=hang))
    elapsed = time.monotonic() - began
    assert code == 0, out + err
    assert "injected hang before step 3" in out and "resumed from" in out and "at step 2" in out, out
    assert re.search(r"time(d)? ?out", err, re.I), err[-3000:]  # rank 0 gave up waiting: gloo's timeout
    _assert_same_end(straight_run, losses_of(out), final)
    assert elapsed < 600, elapsed  # not gloo's default 30 minutes


def test_a_failed_run_keeps_its_checkpoints_and_prints_the_resume_command(plan_path, straight_run, tmp_path) -> None:
    final = tmp_path / "final.pt"
    crash = {"MESHPLAN_FAIL_AT_STEP": "3", "MESHPLAN_FAIL_RANK": "1"}
    code, out, err = finish(start(plan_path, "--checkpoint-every", "2", "--max-restarts", "0",
                                  "--save-final", str(final), env=crash))
    assert code == 1, out + err
    assert losses_of(out) == pytest.approx({s: straight_run.losses[s] for s in (1, 2)}, abs=1e-5)
    match = re.search(r"^meshplan: error: the run failed \(torchrun exited with status 1.*"
                      r"its checkpoints are kept in (\S+) \(newest: step-000002\); resume with: (.+)$", err, re.M)
    assert match, err
    kept, command = Path(match.group(1)), shlex.split(match.group(2))
    try:
        assert sorted(p.name for p in kept.iterdir()) == ["step-000002"]
        assert command[:2] == ["meshplan", "run"] and "--checkpoint-dir" in command
        code, out, err = finish(start(plan_path, cmd=[sys.executable, "-m", "meshplan.cli", *command[1:]]))
        assert code == 0, out + err
        assert f"resumed from {kept / 'step-000002'} at step 2" in out
        losses = losses_of(out)
        assert sorted(losses) == [3, 4]
        _assert_same_end(straight_run, {**{s: straight_run.losses[s] for s in (1, 2)}, **losses}, final)
    finally:
        import shutil

        shutil.rmtree(kept, ignore_errors=True)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; whoever adopted it has not reaped it yet


def test_a_killed_agent_takes_its_workers_along(plan_path, tmp_path) -> None:
    proc = start(plan_path, cmd=[sys.executable, "-m", "meshplan.cli", "run", str(plan_path),
                                 "--nproc", "2", "--steps", "1000000"])
    try:
        for line in proc.stdout:
            if line.startswith("step 2 loss"):
                break
        agents = _children(proc.pid)
        assert len(agents) == 1, agents
        workers = _children(agents[0])
        assert len(workers) == 2, workers
        os.kill(agents[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [w for w in workers if _alive(w)], "workers outlived their torchrun agent"
        code, _, err = finish(proc, timeout_s=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 128 + signal.SIGKILL, err
    assert re.search(r"^meshplan: error: the run failed \(torchrun was killed by SIGKILL; its workers exit with it\)",
                     err, re.M), err
