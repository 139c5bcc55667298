"""``meshplan run`` from the tests: start it in a session of its own (so that a timeout stops
torchrun's workers too, not only the cli), wait for it, read the losses it prints."""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_cases import TOTAL
from parity_support import make_plan


def write_plan(path: Path) -> Path:
    """gpt-tiny, dp2 with ZeRO-3, on 2 CPU processes: the plan every ``meshplan run`` test runs."""
    path.write_text(dataclasses.replace(make_plan("gpt-tiny", dp=2, zero=3), cluster="cpu:1x2").to_json())
    return path


def start(plan_path: Path, *extra: str, env: dict | None = None, cmd: list[str] | None = None) -> subprocess.Popen:
    cmd = cmd or [sys.executable, "-m", "meshplan.cli", "run", str(plan_path), "--nproc", "2", "--steps", str(TOTAL),
                  *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)


def finish(proc: subprocess.Popen, timeout_s: float = 300) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"meshplan run did not end within {timeout_s} s:\n{out}\n{err}")
    return proc.returncode, out, err


def losses_of(out: str) -> dict[int, float]:
    return {int(s): float(x) for s, x in re.findall(r"^step (\d+) loss (\S+)$", out, re.M)}
