"""Rank side of test_dispatch_counts: one training step of tiny GPT plans run by meshplan's runtime
on gloo, every aten op it dispatches counted with a ``TorchDispatchMode`` per phase (forward, loss,
backward, optimizer step) and kind (plain or DTensor). Rank 0 writes the counts as JSON."""
from __future__ import annotations

import collections
import json
import os
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

LAYERS = (1, 2)  # the difference of the two is one layer; one layer minus a layer is the edges
# ops that belong to collectives (timed by collectives.py) or the profiler, not to the model's ops:
# functional collectives, and the split/cat DTensor's gloo path uses to gather or scatter a dim > 0
NOT_MODEL_OPS = ("_c10d_functional.", "profiler.", "aten.cat.", "aten.split.")


def tiny(layers: int) -> dict:
    return dict(family="gpt", layers=layers, hidden=32, heads=4, vocab=64, max_seq_len=16, name="tiny")


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.phase = ""
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if not str(func).startswith(NOT_MODEL_OPS):
            kind = "dtensor" if any(issubclass(t, DTensor) for t in types) else "plain"
            self.counts[f"{self.phase}/{kind}"] += 1
        return func(*args, **(kwargs or {}))


def count_step(plan_fields: dict, layers: int) -> dict[str, int]:
    from meshplan import ir, zoo
    from meshplan.runtime import apply
    from meshplan.runtime.train import synthetic_batch

    model = tiny(layers)
    plan = ir.Plan(model=model, cluster="cpu:1x2", global_batch=4, seq_len=16, recompute=("none",) * layers,
                   dtype="float32", **plan_fields)
    torch.manual_seed(0)
    pm = apply(plan, zoo.build_from_config(model))
    inputs, targets = synthetic_batch(model["vocab"], 4, 16, 0, 0)
    pm.step(inputs, targets)  # warm-up: lazy state (optimizer moments, step counters) is created here
    x, y = pm.local_batch(inputs, targets)
    mode = Count()
    with mode:  # one micro-batch, as PlannedModule._accumulate runs each
        mode.phase = "fwd"
        logits = pm.module(x)
        mode.phase = "loss"
        loss = pm.loss_fn(logits, y)
        mode.phase = "bwd"
        loss.backward()
        mode.phase = "opt"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            pm.optimizer.step()
    pm.optimizer.zero_grad()
    # collectives run inside DTensor's dispatch, where the mode does not see them: the profiler does
    mode.counts["opt/all-reduce"] = sum(e.count for e in prof.key_averages() if e.key == "c10d::allreduce_")
    return dict(mode.counts)


def run(rank: int, world: int, port: int, cases: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    warnings.filterwarnings("ignore")
    try:
        from meshplan.runtime import init_distributed

        init_distributed()
        got = {f"{name}/{layers}": count_step(fields, layers) for name, fields in cases.items() for layers in LAYERS}
        if rank == 0:
            Path(out, "counts.json").write_text(json.dumps(got))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        Path(out, f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    os._exit(0)  # gloo's threads can abort a finished process in interpreter teardown
