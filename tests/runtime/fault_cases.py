"""What each rank runs in the checkpoint fault tests (one 4-process launch):

- expert parallelism: moe-tiny trains 2 steps under an ep x dp plan and saves; fresh models with other
  weights load it under other plans (another ep, no ep) and train 2 more steps;
- damage: gpt-tiny trains 4 steps saving at 2 and 4 (``resume.save_step``); then step 4's largest shard
  gets 8 bytes overwritten, and ``resume.resume`` in a fresh model must fall back to step 2 (training
  on to step 4); then step 4 is saved again, its ``.metadata`` truncated, and the fallback happens
  again; then step 2's largest shard is emptied too, and no checkpoint loads.
Records the losses (every rank), the final parameters (rank 0), what rank 0 wrote to stderr, and
the errors."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from checkpoint_cases import OTHER_SEED, SAVE_AT, TOTAL, _fresh, _train, plan_for
from meshplan.runtime.checkpoint import CheckpointError
from meshplan.runtime.expert import ExpertParallelMixin
from meshplan.runtime.resume import resume, save_step
from parity_support import SEED

VOCAB = 512


def _expert_numel(pm) -> int:
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for m in pm.module.modules()
               if isinstance(m, ExpertParallelMixin) for p in m.parameters(recurse=False))


def _continue(pm, start: int, rank: int) -> dict[str, Any]:
    losses = _train(pm, VOCAB, range(start + 1, TOTAL + 1))
    params = pm.full_parameters()
    return {"step": start, "losses": losses, "params": params if rank == 0 else None}


def run_experts(rank: int, payload: dict[str, Any], outdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    save = payload["save"]
    pm = _fresh("moe-tiny", plan_for("moe-tiny", **save["plan"]), seed=SEED)
    results[save["name"]] = {"losses": _train(pm, VOCAB, range(1, SAVE_AT + 1)), "expert_numel": _expert_numel(pm)}
    pm.save(str(outdir / "moe"))
    for case in payload["loads"]:
        pm = _fresh("moe-tiny", plan_for("moe-tiny", **case["plan"]))
        results[case["name"]] = {**_continue(pm, pm.load(str(outdir / "moe")), rank), "expert_numel": _expert_numel(pm)}
    return results


def _damage(path: Path, how: str) -> str:
    """Overwrite 8 bytes in the middle of ``path`` ("flip"), keep its first half ("truncate") or empty it."""
    data = bytearray(path.read_bytes())
    if how == "flip":
        middle = len(data) // 2
        data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    elif how == "truncate":
        data = data[:len(data) // 2]
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    return path.name


def _largest_shard(step_dir: Path) -> Path:
    return max(step_dir.glob("*.distcp"), key=lambda p: p.stat().st_size)


def _resume_after(rank: int, root: Path, damage: list[tuple[str, str]], plan: dict) -> dict[str, Any]:
    """Damage the named files (rank 0), then resume a fresh model from ``root`` and train on."""
    names = []
    if rank == 0:
        for step_name, what in damage:
            step_dir = root / step_name
            target = step_dir / ".metadata" if what == "truncate" else _largest_shard(step_dir)
            names.append(_damage(target, what))
    dist.barrier()
    pm = _fresh("gpt-tiny", plan_for("gpt-tiny", **plan), seed=OTHER_SEED)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            start = resume(pm, root)
    except CheckpointError as exc:
        return {"error": str(exc), "stderr": stderr.getvalue(), "damaged": names}
    return {**_continue(pm, start, rank), "stderr": stderr.getvalue(), "damaged": names}


def run_damage(rank: int, payload: dict[str, Any], outdir: Path) -> dict[str, Any]:
    root = outdir / "damage"
    pm = _fresh("gpt-tiny", plan_for("gpt-tiny", **payload["save"]), seed=SEED)
    for step in range(1, TOTAL + 1):
        _train(pm, VOCAB, range(step, step + 1))
        if step % SAVE_AT == 0:
            save_step(pm, root, step)
    results = {"files": sorted(p.name for p in (root / "step-000004").iterdir()) if rank == 0 else None}
    results["flip"] = _resume_after(rank, root, [("step-000004", "flip")], payload["load"])
    save_step(pm, root, TOTAL)  # a whole step 4 again, from the uninterrupted model
    results["truncate"] = _resume_after(rank, root, [("step-000004", "truncate")], payload["load"])
    results["none"] = _resume_after(rank, root, [("step-000002", "empty")], payload["load"])
    return results


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    results = {"experts": run_experts(rank, payload["experts"], outdir), "damage": run_damage(rank, payload["damage"], outdir)}
    torch.save(results, outdir / f"rank{rank}.pt")
