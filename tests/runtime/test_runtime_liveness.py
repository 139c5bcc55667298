"""One-process checks of the pieces behind checkpoints that cannot lie and runs that cannot hang: the
manifest catches a flipped byte, a truncated file and a missing one; the process-group timeout follows
the predicted step; a bad ``--pg-timeout`` is one line and exit 2; a process that asked to exit with
its parent does, even when that parent is SIGKILLed."""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from meshplan.runtime.distributed import PG_TIMEOUT_FLOOR_S, PG_TIMEOUT_STEPS, pg_timeout_s
from meshplan.runtime.manifest import MANIFEST_FILE, read_manifest, verify, write_manifest
from parity_support import make_plan


def _checkpoint(tmp_path: Path) -> Path:
    root = tmp_path / "step-000002"
    root.mkdir()
    (root / ".metadata").write_bytes(bytes(range(200)))
    (root / "__0_0.distcp").write_bytes(os.urandom(5000))
    (root / "__1_0.distcp").write_bytes(b"")
    write_manifest(root, step=2)
    return root


def test_the_manifest_lists_every_file_and_verifies_them(tmp_path) -> None:
    root = _checkpoint(tmp_path)
    manifest = read_manifest(root)
    assert manifest["step"] == 2
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert manifest["files"]["__0_0.distcp"]["size_bytes"] == 5000
    assert verify(root, manifest) == []
    assert sorted(p.name for p in root.iterdir()) == sorted([*manifest["files"], MANIFEST_FILE])  # no temp file left


@pytest.mark.parametrize("how", ["flip", "truncate", "remove", "grow"])
def test_the_manifest_names_a_damaged_file(tmp_path, how) -> None:
    root = _checkpoint(tmp_path)
    manifest = read_manifest(root)
    shard = root / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    if how == "flip":
        data[2500] ^= 0x01  # one bit: the size stays, the CRC does not
        shard.write_bytes(bytes(data))
    elif how == "truncate":
        shard.write_bytes(bytes(data[:100]))
    elif how == "grow":
        (root / "__1_0.distcp").write_bytes(b"x")
    else:
        shard.unlink()
    problems = verify(root, manifest)
    expect = {"flip": r"'__0_0\.distcp' has CRC-32 [0-9a-f]{8} but [0-9a-f]{8} was written",
              "truncate": r"'__0_0\.distcp' has 100 bytes but 5000 were written",
              "grow": r"'__1_0\.distcp' has 1 bytes but 0 were written",
              "remove": r"'__0_0\.distcp' is missing"}[how]
    assert len(problems) == 1 and re.fullmatch(expect, problems[0]), problems


def test_a_checkpoint_without_a_valid_manifest_is_incomplete(tmp_path) -> None:
    from meshplan.runtime.checkpoint import is_complete

    root = _checkpoint(tmp_path)
    assert is_complete(root)
    (root / MANIFEST_FILE).write_text('{"format": 1, "files": ')  # cut short
    assert read_manifest(root) is None and not is_complete(root)
    (root / MANIFEST_FILE).unlink()
    assert not is_complete(root)


def test_the_process_group_timeout_follows_the_predicted_step() -> None:
    assert pg_timeout_s(0.0) == PG_TIMEOUT_FLOOR_S
    assert pg_timeout_s(0.5) == PG_TIMEOUT_FLOOR_S  # 20 x 0.5 s is under the floor
    assert pg_timeout_s(12.0) == PG_TIMEOUT_STEPS * 12.0
    assert pg_timeout_s(12.0, 15) == 15.0
    with pytest.raises(ValueError, match="must be positive"):
        pg_timeout_s(1.0, 0)


def test_a_bad_pg_timeout_is_one_line_and_exit_2(tmp_path) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(dataclasses.replace(make_plan("gpt-tiny", dp=2), cluster="cpu:1x2").to_json())
    proc = subprocess.run([sys.executable, "-m", "meshplan.cli", "run", str(plan_path), "--nproc", "2",
                           "--pg-timeout", "-5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "--pg-timeout is -5.0 but must be a positive number" in proc.stderr


def test_a_process_exits_when_its_parent_is_killed(tmp_path) -> None:
    """parent -> child: the child calls exit_with_parent and sleeps; SIGKILL the parent, the child ends."""
    child_pid = tmp_path / "child.pid"
    child = textwrap.dedent(f"""
        import os, time
        from meshplan.runtime.distributed import exit_with_parent
        exit_with_parent()
        open({str(child_pid)!r}, "w").write(str(os.getpid()))
        time.sleep(300)
    """)
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not child_pid.exists() or not child_pid.read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.1)
        pid = int(child_pid.read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "the child outlived its killed parent"
    finally:
        try:  # the parent's session: a child that survived goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
