"""What one training step really holds in memory, measured on this rank: the check of the cost
model's memory prediction (``Prediction.peak_memory_bytes``, which must never be below it).

``measure_plan_memory`` runs the set-up (model, plan, a first step) and the measured step under one
``torch.profiler`` profile with ``profile_memory=True``, which records every allocation and free of
PyTorch's allocator with its address and size, on CPU as on CUDA; replaying them gives the bytes
live at each moment: ``resident`` when the step starts (parameters and their shards, gradients,
optimizer state, DDP buckets, FSDP buffers), ``peak`` the most during it. ``resident_bytes`` counts
only what is reachable from the module and optimizer (a check of the replay). On CUDA the allocator's
``max_memory_allocated`` gives the same figure; this module is for the CPU ranks that tests and
``bench/cpu_memory.py`` run, where PyTorch keeps no such peak.

``return_freed_memory`` makes a CPU process give freed tensors back to the operating system, so that
its resident set tracks what it holds (``bench/memory_demo.py``).
"""
from __future__ import annotations

import bisect
import ctypes
import json
import platform
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile, record_function


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def resident_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the distinct storages behind this rank's parameters, buffers, gradients and optimizer state."""
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [p.grad for p in module.parameters() if p.grad is not None]
    if optimizer is not None:
        tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    seen: dict[int, int] = {}
    for t in tensors:
        local = _local(t)
        if local.device.type == "meta":
            continue
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _memory_events(prof) -> tuple[list[dict], list[dict]]:
    """The CPU allocator's [memory] events and the op/annotation events of a finished profile."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp, "trace.json")
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0),
                    key=lambda e: e["ts"])
    return memory, [e for e in events if e.get("ph") == "X"]


def _collective_windows(ops: list[dict]) -> list[tuple[float, float]]:
    """The spans of time inside c10d collective ops (``c10d::_reduce_scatter_base_``...), overlapping
    and nested ones merged, in time order."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted((e["ts"], e["ts"] + e["dur"]) for e in ops if e.get("name", "").startswith("c10d::")):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _live_bytes(memory: list[dict], ops: list[dict] = (),
                maps: tuple[float, list[tuple[int, int]]] | None = None) -> list[tuple[float, int]]:
    """(time, bytes live) after each event, counting only blocks allocated inside the profile: the
    allocator's own running total is process-wide and drifts across profiles.

    The profiler records a free only on a thread it follows. Gloo runs each collective on a worker
    thread, and the last reference to a collective's own buffers (the copy of the input that its
    reduce-scatter all-reduces, ``ProcessGroupGloo::reduce_scatter_tensor_coalesced``) is often
    dropped there, after the work's profiled part: that free is never recorded, and a replay that
    trusted the record would count the block live for the rest of the profile (the next step's start
    was seen holding 3-12 MB of such copies on the bench GPT, in some runs and not others). So a block
    whose free is never recorded ends where the record proves it gone: at the end of the c10d
    collective it was allocated in (a synchronous collective has dropped its buffers when it returns),
    else when the operating system shows it gone (``maps``: a time and the address ranges mapped
    into the process then, see ``_mapped_ranges``), else when its address is handed out again; a
    block with none of these stays live to the end."""
    windows = _collective_windows(list(ops))
    starts = [w[0] for w in windows]
    open_: dict[int, list] = {}
    blocks: list[list] = []  # [address, allocated at, bytes, free recorded at, address handed out again at]
    for e in memory:
        addr, nbytes, ts = e["args"]["Addr"], e["args"]["Bytes"], e["ts"]
        if nbytes > 0:
            if addr in open_:
                open_[addr][4] = ts  # freed unrecorded
            open_[addr] = block = [addr, ts, nbytes, None, None]
            blocks.append(block)
        elif addr in open_:
            open_.pop(addr)[3] = ts
    changes: list[tuple[float, int]] = []
    for addr, t_alloc, nbytes, t_free, t_reused in blocks:
        if t_free is None:
            i = bisect.bisect_right(starts, t_alloc) - 1
            in_collective = i >= 0 and t_alloc <= windows[i][1]
            if in_collective:
                t_free = windows[i][1]
            elif maps is not None and t_alloc < maps[0] and not _is_mapped(maps[1], addr):
                t_free = maps[0] if t_reused is None else min(t_reused, maps[0])
            else:
                t_free = t_reused
        changes.append((t_alloc, nbytes))
        if t_free is not None:
            changes.append((t_free, -nbytes))
    total, out = 0, []
    for ts, delta in sorted(changes, key=lambda c: (c[0], c[1] > 0)):
        total += delta
        out.append((ts, total))
    return out


def _mapped_ranges() -> list[tuple[int, int]] | None:
    """The address ranges mapped into this process now, sorted (``/proc/self/maps``); None where there is none.

    What it proves: glibc serves a large block (128 KiB, or up to 32 MiB once its threshold has grown)
    with its own ``mmap`` and unmaps it on free, so a block whose address lies in no mapped range has
    been freed, whichever thread freed it. This is how the replay sees DDP's 21 MB wrap-time broadcast
    copy gone (``_broadcast_coalesced``'s flattened parameters, released by gloo's worker thread on
    some runs and not others, unrecorded): one CI run under load counted it live through the measured
    step (134.1 MB against 113.0 MB in every other run). A block from the heap stays mapped after its
    free, so this rule can only end a block that is really gone, never one that is live."""
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return sorted((int(lo, 16), int(hi, 16)) for lo, hi in (line.split(maxsplit=1)[0].split("-") for line in text.splitlines()))


def _is_mapped(ranges: list[tuple[int, int]], addr: int) -> bool:
    i = bisect.bisect_right(ranges, (addr, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= addr < ranges[i][1]


def step_allocated_peak(run_step) -> int:
    """The most bytes ``run_step()`` holds at once beyond what existed before it (blocks allocated
    before it and freed inside it are not subtracted, so this errs high)."""
    return measure_plan_memory(lambda: None, lambda _: run_step())["in_step"]


MEASURED = "meshplan.measured_step"
MAPS = "meshplan.mapped_ranges"


def measure_plan_memory(setup, step) -> dict[str, int]:
    """{"resident", "in_step", "peak"} bytes: ``state = setup()`` (build the model, apply the plan, a
    first step so the optimizer makes its state) and ``step(state)`` run under one memory profile, so
    that every block the plan allocates is seen (DDP's buckets, FSDP's buffers, optimizer state);
    ``resident`` is what is live when the measured step starts, ``peak`` the most live during it."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        state = setup()
        with record_function(MAPS):
            ranges = _mapped_ranges()
        with record_function(MEASURED):
            step(state)
    memory, ops = _memory_events(prof)
    window = next(e for e in ops if e.get("name") == MEASURED)
    begin, end = window["ts"], window["ts"] + window["dur"]
    maps_at = next(e["ts"] for e in ops if e.get("name") == MAPS)
    series = _live_bytes(memory, ops, None if ranges is None else (maps_at, ranges))
    resident = ([0] + [b for t, b in series if t < begin])[-1]
    peak = max([resident, *(b for t, b in series if begin <= t <= end)])
    return {"resident": resident, "in_step": peak - resident, "peak": peak}


M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's default, before its dynamic adjustment raises it


def return_freed_memory() -> bool:
    """Serve every allocation of 128 KiB or more with its own ``mmap`` (returned to the system on free), as
    glibc does until its first free of such a block; returns whether it could (glibc only).

    Why: PyTorch's CPU allocator is ``posix_memalign``/``free`` (no caching), so a CPU rank's resident
    set is glibc's. glibc's threshold for ``mmap`` is dynamic: freeing an mmapped block raises it to that
    block's size, up to 32 MiB on 64-bit (mallopt(3), M_MMAP_THRESHOLD). After the first freed
    all-gather buffer, every tensor under 32 MiB (a 1024 x 4096 fp32 weight is 16 MiB) comes from the
    heap, whose freed space is reused but rarely returned: FSDP's gathered parameters and gradients,
    activations and optimizer temporaries, each freed in turn, pile up. A ZeRO-3 rank of a 443M-parameter
    Llama was seen to hold 1.0 GB more this way after one step (2 ranks, fp32). Setting the threshold
    explicitly turns the adjustment off. Each large tensor then costs an ``mmap``, a ``munmap`` and
    fresh zeroed pages: noise beside a training step's arithmetic.

    Call it first, before the model is built: glibc serves a request from free space in the heap before
    it considers ``mmap``, so a heap already grown (building on meta allocates each full parameter and
    frees it, which grew a rank's heap by 1.9 GB for a 595M-parameter model) keeps serving every later
    tensor from pages that stay resident (``bench/memory_demo.py``: 2.5 GB per rank instead of 1.9 GB).
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
