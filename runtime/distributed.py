"""The process group and the device: the only place meshplan reads the environment torchrun sets."""
from __future__ import annotations

import atexit
import datetime
import os

import torch
import torch.distributed as dist


def device_for_rank() -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` when CUDA is there, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_distributed() -> bool:
    """Initialize the default process group from torchrun's environment if it is not already.

    NCCL on GPUs, gloo on CPUs (where the ranks share the cores, so each uses one thread).
    Returns True if this call created the group (the caller then destroys it).
    """
    if dist.is_initialized():
        return False
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise RuntimeError("meshplan.runtime needs torch.distributed: launch with torchrun (which sets RANK and "
                           "WORLD_SIZE) or call torch.distributed.init_process_group first")
    device = device_for_rank()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    # a user's loop (plan.apply) may simply end: a gloo group still alive when the interpreter exits
    # aborts the process ("terminate called without an active exception"), so close it on the way out
    atexit.register(_destroy_if_alive)
    return True


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
