"""The process group and the device: the only place meshplan reads the environment torchrun sets.

Liveness. A rank that stops (SIGSTOP, a hung kernel, a dead host) must fail the step, not stall
the job for gloo's default 30 minutes: the group's timeout is ``pg_timeout_s`` (20 predicted steps,
at least a minute), after which the ranks waiting in a collective raise and torchrun restarts the
job. A torchrun worker also exits when its agent dies (``PR_SET_PDEATHSIG``): torchrun starts each
worker in a session of its own, so without it a killed agent leaves the workers running as orphans.
"""
from __future__ import annotations

import atexit
import ctypes
import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist


def device_for_rank() -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` when CUDA is there, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


PG_TIMEOUT_FLOOR_S = 60.0  # start-up, the first step's lazy initialization and a checkpoint fit in it
PG_TIMEOUT_STEPS = 20  # predicted steps a collective may wait before the job is declared hung
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_PID = os.getppid()  # as early as meshplan can look: the agent, if it has not died already


def pg_timeout_s(step_time_s: float, override_s: float | None = None) -> float:
    """How long a collective may wait: ``override_s`` if given, else ``PG_TIMEOUT_STEPS`` predicted
    steps, at least ``PG_TIMEOUT_FLOOR_S``."""
    if override_s is not None:
        if override_s <= 0:
            raise ValueError(f"the process-group timeout must be positive, got {override_s} s")
        return float(override_s)
    return max(PG_TIMEOUT_FLOOR_S, PG_TIMEOUT_STEPS * step_time_s)


def init_distributed(timeout_s: float | None = None) -> bool:
    """Initialize the default process group from torchrun's environment if it is not already.

    NCCL on GPUs, gloo on CPUs (where the ranks share the cores, so each uses one thread).
    ``timeout_s``: how long a collective may wait for a peer (``pg_timeout_s``; default torch's).
    Under torchrun, this worker also exits when its agent dies. Returns True if this call created the
    group (the caller then destroys it).
    """
    if dist.is_initialized():
        return False
    if "TORCHELASTIC_RUN_ID" in os.environ:
        exit_with_parent()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError("meshplan.runtime needs torch.distributed: launch with torchrun (which sets RANK and "
                           "WORLD_SIZE) or call torch.distributed.init_process_group first")
    device = device_for_rank()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout)
    # a user's loop (plan.apply) may simply end: a gloo group still alive when the interpreter exits
    # aborts the process ("terminate called without an active exception"), so close it on the way out
    atexit.register(_destroy_if_alive)
    return True


def exit_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent exits (Linux; elsewhere nothing), and
    leave now if the parent is already gone (it died before the request: this process was re-parented)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        return  # not allowed here (a sandbox): the worker simply keeps torch's behaviour
    if os.getppid() != _PARENT_PID or os.getppid() == 1:
        print(f"[meshplan] rank {os.environ.get('RANK', '?')}: the launcher (pid {_PARENT_PID}) has exited; "
              "leaving", file=sys.stderr, flush=True)
        os._exit(1)


def _destroy_if_alive() -> None:
    if not dist.is_initialized():
        return
    try:  # meet the other ranks first (bounded: a rank that died must not hang the exit)
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
        else:
            dist.barrier()
    except Exception:  # noqa: BLE001 - leaving anyway; the group is destroyed below
        pass
    dist.destroy_process_group()


def close_distributed(created: bool, *, ok: bool) -> None:
    """Destroy the group this process created. On success all ranks meet first, so no rank tears its
    gloo pairs down while a peer still talks to it (seen as a SIGABRT at exit under load)."""
    if not created or not dist.is_initialized():
        return
    if ok:
        dist.barrier()
    dist.destroy_process_group()
