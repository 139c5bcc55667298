"""One uninterrupted ``meshplan run`` for the whole session: the checkpoint and fault tests compare
their interrupted runs of the same plan with it (each run starts 4 processes, seconds on 2 cores)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from run_support import finish, losses_of, start, write_plan


@dataclass(frozen=True, slots=True, kw_only=True)
class StraightRun:
    plan_path: Path
    out: str
    losses: dict[int, float]
    params: dict[str, torch.Tensor]


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory) -> StraightRun:
    tmp = tmp_path_factory.mktemp("straight")
    plan_path, final = write_plan(tmp / "plan.json"), tmp / "final.pt"
    code, out, err = finish(start(plan_path, "--save-final", str(final)))
    assert code == 0, out + err
    return StraightRun(plan_path=plan_path, out=out, losses=losses_of(out), params=torch.load(final))
