"""Train a model under a plan on synthetic tokens: the in-process twin of the emitted script.

    torchrun --nproc-per-node N -m meshplan.runtime.train PLAN.json --steps K [--seed S]

prints the same ``step N loss X`` lines and median step time as the script ``emit_source(plan)``
writes, from the same data stream (``synthetic_batch``) and the same initial weights
(``torch.manual_seed(seed)`` before building the model).
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ..ir import Plan
from .distributed import close_distributed, init_distributed
from .distributed import pg_timeout_s as timeout_for_step
from .planned import OptimizerFactory, PlannedModule, apply

ModelBuilder = Callable[[dict[str, Any]], nn.Module]
DEFAULT_BUILDER = "meshplan.zoo:build_from_config"


def synthetic_batch(vocab: int, global_batch: int, seq_len: int, seed: int, step: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch of random tokens, the same on every rank: (inputs, next tokens)."""
    generator = torch.Generator().manual_seed(seed + step)
    tokens = torch.randint(vocab, (global_batch, seq_len + 1), generator=generator)  # (b, s + 1)
    return tokens[:, :-1], tokens[:, 1:]


def plan_pg_timeout_s(plan: Plan, override_s: float | None = None) -> float:
    """The process group's timeout for ``plan``: ``distributed.pg_timeout_s`` of its predicted step."""
    return timeout_for_step(plan.prediction.step_time_s if plan.prediction is not None else 0.0, override_s)


def run_training(plan: Plan, model: nn.Module, steps: int = 5, seed: int = 0, *,
                 optimizer: OptimizerFactory | None = None, fuse: bool = False,
                 pg_timeout_s: float | None = None) -> list[float]:
    """Shard ``model`` (built after ``torch.manual_seed(seed)``) and train ``steps`` steps; rank 0 prints
    ``step N loss X`` and the median step time after the first step. Returns the losses (every rank).
    ``pg_timeout_s`` overrides how long a collective waits for a stopped rank (``plan_pg_timeout_s``)."""
    created = init_distributed(plan_pg_timeout_s(plan, pg_timeout_s))
    try:
        losses = train_steps(apply(plan, model, optimizer=optimizer, fuse=fuse), plan, range(1, steps + 1), seed)
    except BaseException:
        close_distributed(created, ok=False)
        raise
    close_distributed(created, ok=True)
    return losses


def train_steps(pm: PlannedModule, plan: Plan, steps: range, seed: int, *,
                before: Callable[[int], None] | None = None, after: Callable[[int], None] | None = None
                ) -> list[float]:
    """Train ``steps`` on the synthetic stream; rank 0 prints each loss and the median step time after
    the first. ``before(step)`` and ``after(step)`` run around each step (fault injection, checkpoints)."""
    losses, times = [], []
    rank0 = dist.get_rank() == 0
    for step in steps:
        if before is not None:
            before(step)
        start = time.perf_counter()
        inputs, targets = synthetic_batch(plan.model["vocab"], plan.global_batch, plan.seq_len, seed, step)
        losses.append(pm.step(inputs, targets))
        times.append(time.perf_counter() - start)
        if rank0:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)
        if after is not None:
            after(step)
    if rank0 and times:
        timed = times[1:] or times  # the first step pays for lazy initialization
        print(f"median step time {statistics.median(timed):.4f} s over {len(timed)} steps after warm-up",
              flush=True)
    return losses


def load_builder(spec: str) -> ModelBuilder:
    """``"package.module:function"`` -> the function (the model builder is named, not imported, here:
    runtime does not depend on the zoo)."""
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"--builder must look like 'package.module:function', got {spec!r}")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None, *, model_builder: ModelBuilder | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshplan.runtime.train", description=__doc__.splitlines()[0])
    parser.add_argument("plan", help="a plan file (meshplan plan ... -o PLAN.json)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--builder", default=DEFAULT_BUILDER,
                        help=f"model builder 'module:function' taking plan.model (default {DEFAULT_BUILDER})")
    parser.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=False,
                        help="run the plan's fusions as generated Triton kernels")
    parser.add_argument("--pg-timeout", type=float, metavar="SECONDS",
                        help="how long a collective waits for a stopped rank (default: 20 predicted steps, >= 60 s)")
    args = parser.parse_args(argv)
    plan = Plan.load(args.plan)
    builder = model_builder or load_builder(args.builder)
    torch.manual_seed(args.seed)  # every rank builds the same initial weights
    run_training(plan, builder(plan.model), steps=args.steps, seed=args.seed, fuse=args.fuse,
                 pg_timeout_s=args.pg_timeout)
    return 0


if __name__ == "__main__":
    code = main()
    # a torchrun worker: leave without the interpreter's teardown, where a gloo group's threads can
    # still abort the process after all the work is done ("terminate called without an active exception")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
