"""What one training step really holds in memory, measured on this rank: the check of the cost
model's memory prediction (``Prediction.peak_memory_bytes``, which must never be below it).

    peak = resident + max over the step of (bytes allocated since the step began - bytes freed)

``resident`` is what lives across steps: this rank's parameters (their local shards under
DTensor/FSDP2), buffers, gradients still attached and the optimizer's state, each storage counted
once. The in-step part comes from PyTorch's own allocator accounting: ``torch.profiler`` with
``profile_memory=True`` records every allocation and free with the allocator's running total
("Total Allocated"), on CPU as on CUDA. Blocks allocated before the step and freed inside it are not
subtracted by that counter, so the figure errs high, never low. On CUDA the allocator's
``max_memory_allocated`` gives the same figure; this module is for the CPU ranks that tests and
``bench/cpu_memory.py`` run, where PyTorch keeps no such peak.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile


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


def step_allocated_peak(run_step) -> int:
    """The most bytes ``run_step()`` holds at once beyond what existed before it (allocator's count)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        run_step()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp, "trace.json")
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events
              if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0]
    return max([0, *totals])


def measure_step_memory(pm, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, int]:
    """{"resident", "in_step", "peak"} bytes of one ``pm.step(inputs, targets)`` on this rank.
    Run a step first: the optimizer creates its state lazily on the first one."""
    resident = resident_bytes(pm.module, None) + _optimizer_bytes(pm.optimizer)  # under pp: this rank's stages
    in_step = step_allocated_peak(lambda: pm.step(inputs, targets))
    return {"resident": resident, "in_step": in_step, "peak": resident + in_step}


def _optimizer_bytes(optimizer) -> int:
    """The optimizer's state (a ZeroRedundancyOptimizer keeps only this rank's shard of it)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps the local optimizer
    seen: dict[int, int] = {}
    for state in inner.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.numel() > 1:
                storage = _local(v).untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
