"""Training that survives a crash: checkpoint every C steps, resume from the latest complete one.

``meshplan run PLAN --nproc N --steps K --checkpoint-every C --max-restarts R`` launches torchrun
elastically: when a worker dies, torchrun stops the others and starts all of them again (up to R
times), and each one resumes from the newest complete checkpoint under the checkpoint directory.
Data and optimizer state continue where the checkpoint left them (step counter, AdamW moments,
RNG, and with ``--data`` the token file's position), so the job ends with the same losses and
parameters as a run that never crashed, having read the same tokens.

Layout: ``DIR/step-000004/`` per saved step. A save is written to ``step-000004.partial`` and
renamed by rank 0 once every rank has finished and the manifest (sizes and CRC-32s of every file,
``manifest.py``) is written, so a crash during a save leaves no directory that looks complete.

A resume verifies the newest checkpoint's files; if one differs from what was written (a flipped
byte, a truncated shard or ``.metadata``) or the manifest is missing, it says so on stderr (naming
the file) and falls back to the next older one: ``KEEP_LAST`` checkpoints are kept for this.

Fault injection for tests: with ``MESHPLAN_FAIL_AT_STEP=S`` (and ``MESHPLAN_FAIL_RANK=r``, default 0)
rank r exits with status 1 just before step S, on the first attempt only
(``TORCHELASTIC_RESTART_COUNT`` is 0 or unset); with ``MESHPLAN_FAIL_HOW=hang`` it hangs instead (sleeps,
joining no collective again), as a hung rank would, and its peers wait out the process group's timeout. (A hang
in Python, not SIGSTOP: torchrun's restart sends SIGTERM to the surviving workers and waits 30 s for them to exit,
which a stopped process never does, ``LocalElasticAgent._stop_workers`` in torch 2.13, before it kills them.)
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..ir import Plan
from .checkpoint import CheckpointError, DamagedCheckpointError, is_complete, load_training_state, save_checkpoint
from .data import TokenStream
from .distributed import close_distributed, init_distributed
from .planned import OptimizerFactory, PlannedModule, apply
from .train import Options, plan_pg_timeout_s, prepare, prepare_model, train_steps

STEP_DIR = re.compile(r"^step-(\d+)$")
KEEP_LAST = 2  # checkpoints kept: the newest, and one more in case the newest is unreadable


def checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Every ``step-N`` directory under ``directory``, newest first (complete or not)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    steps = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(steps, reverse=True)]


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The complete checkpoint (one with a manifest) with the highest step under ``directory``, or None."""
    return next((p for p in checkpoints(directory) if is_complete(p)), None)


def save_step(pm: PlannedModule, directory: str | os.PathLike, step: int, data: TokenStream | None = None) -> Path:
    """Save ``pm`` (and ``data``'s position) as ``directory/step-NNNNNN`` (written aside, renamed when
    complete) and keep the newest ``KEEP_LAST``. A collective."""
    root = Path(directory)
    final, partial = root / f"step-{step:06d}", root / f"step-{step:06d}.partial"
    rank0 = dist.get_rank() == 0
    if rank0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # left by an attempt that crashed while saving
    dist.barrier()
    save_checkpoint(pm, partial, step=step, data_position=None if data is None else data.position)
    dist.barrier()  # every rank has written its shards (and rank 0 the metadata)
    if rank0:
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        _prune(root)
    dist.barrier()
    return final


def _prune(root: Path) -> None:
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)))
    for _, path in steps[:-KEEP_LAST]:
        shutil.rmtree(path, ignore_errors=True)


def maybe_fail(step: int) -> None:
    """Fault injection (see the module docstring): exit this process before ``step`` if told to."""
    fail_at = os.environ.get("MESHPLAN_FAIL_AT_STEP")
    if not fail_at or int(fail_at) != step or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) != 0:
        return
    if dist.get_rank() == int(os.environ.get("MESHPLAN_FAIL_RANK", "0")):
        hang = os.environ.get("MESHPLAN_FAIL_HOW", "exit") == "hang"
        print(f"[meshplan] rank {dist.get_rank()}: injected {'hang' if hang else 'failure'} before step {step}",
              flush=True)
        while hang:
            time.sleep(3600)
        os._exit(1)


def run_resumable(plan: Plan, model: nn.Module, steps: int = 5, seed: int = 0, *,
                  checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0,
                  save_final: str | os.PathLike | None = None,
                  optimizer: OptimizerFactory | None = None, pg_timeout_s: float | None = None,
                  options: Options = Options()) -> list[float]:
    """``train.run_training`` with checkpoints: resume from the newest complete checkpoint under
    ``checkpoint_dir`` if there is one, save every ``checkpoint_every`` steps, and, if ``save_final``
    is given, write the full final parameters there (``torch.save`` on rank 0). Rank 0 prints
    ``step N loss X`` and the median step time after the first step of this attempt. Returns the
    losses of the steps this attempt ran. ``pg_timeout_s`` overrides how long a collective waits for a
    stopped rank (``train.plan_pg_timeout_s``); ``options`` as ``train.run_training`` (a resumed run
    starts from its checkpoint, not from ``options.init_from``)."""
    if checkpoint_every and checkpoint_dir is None:
        raise ValueError("checkpoint_every needs a checkpoint_dir")
    options.check(plan)
    created = init_distributed(plan_pg_timeout_s(plan, pg_timeout_s))
    try:
        pm = apply(plan, prepare_model(plan, model, options), optimizer=optimizer)
        data = prepare(pm, options)  # loads options.init_from: a checkpoint found below replaces it
        start = resume(pm, checkpoint_dir, data)
        losses = _train(pm, plan, range(start + 1, steps + 1), seed, checkpoint_dir, checkpoint_every, data)
        if save_final is not None:
            params = pm.full_parameters()  # a collective: every rank takes part
            if dist.get_rank() == 0:
                torch.save(params, save_final)
    except BaseException:
        close_distributed(created, ok=False)
        raise
    close_distributed(created, ok=True)
    return losses


def resume(pm: PlannedModule, checkpoint_dir: str | os.PathLike | None, data: TokenStream | None = None) -> int:
    """Load the newest checkpoint that verifies, falling back past damaged ones (one line on stderr
    each); 0 if there is none. ``data`` reads on from the checkpoint's position (or, in a checkpoint of
    a synthetic run, from its step's). Raises ``CheckpointError`` if there are checkpoints but none
    verifies."""
    found = checkpoints(checkpoint_dir) if checkpoint_dir is not None else []
    problems = []
    for i, path in enumerate(found):
        try:
            step, position = load_training_state(pm, path)
        except DamagedCheckpointError as exc:  # every rank gets the same verdict
            problems.append(f"{path.name}: {exc}")
            if dist.get_rank() == 0:
                then = f"falling back to {found[i + 1]}" if i + 1 < len(found) else "no older checkpoint is left"
                print(f"[meshplan] {exc}; {then}", file=sys.stderr, flush=True)
            continue
        pm.steps_done = step
        if data is not None:
            data.position = position if position is not None else step * data.global_batch
        if dist.get_rank() == 0:
            where = f", token window {data.position}" if data is not None else ""
            print(f"resumed from {path} at step {step}{where}", flush=True)
        return step
    if problems:
        raise CheckpointError(f"none of the {len(found)} checkpoint(s) under {checkpoint_dir} can be loaded "
                              f"({'; '.join(problems)}); restore a good copy, or give another --checkpoint-dir "
                              "to train from step 0")
    return 0


def _train(pm: PlannedModule, plan: Plan, steps: range, seed: int, checkpoint_dir: str | os.PathLike | None,
           checkpoint_every: int, data: TokenStream | None = None) -> list[float]:
    def after(step: int) -> None:
        if checkpoint_every and step % checkpoint_every == 0:
            save_step(pm, checkpoint_dir, step, data)

    return train_steps(pm, plan, steps, seed, before=maybe_fail, after=after, data=data)
