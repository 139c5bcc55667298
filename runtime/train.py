"""Train a model under a plan: the in-process twin of the emitted script.

    torchrun --nproc-per-node N -m meshplan.runtime.train PLAN.json --steps K [--seed S] [--data FILE]

prints the same ``step N loss X`` lines and median step time as the script ``emit_source(plan)``
writes, from the same data stream (``synthetic_batch``, or the token file ``--data`` names: ``data.py``)
and the same initial weights (``torch.manual_seed(seed)`` before building the model, or a Hugging Face
checkpoint with ``--init-from``: ``pretrained.py``). ``--clip-grad`` clips by the global gradient norm
and ``--compile`` compiles each block before sharding (``clip.py``).
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ..codegen import lower
from ..codegen.options import compile_refusal
from ..codegen.precision import check_runnable
from ..codegen.structure import structure_of
from ..ir import Plan, PlanError
from .clip import check_max_norm, compile_blocks, install_clipping
from .data import TokenFile, TokenStream, open_stream
from .distributed import close_distributed, init_distributed
from .distributed import pg_timeout_s as timeout_for_step
from .memory import return_freed_memory
from .planned import OptimizerFactory, PlannedModule, apply

ModelBuilder = Callable[[dict[str, Any]], nn.Module]
DEFAULT_BUILDER = "meshplan.zoo:build_from_config"


def synthetic_batch(vocab: int, global_batch: int, seq_len: int, seed: int, step: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch of random tokens, the same on every rank: (inputs, next tokens)."""
    generator = torch.Generator().manual_seed(seed + step)
    tokens = torch.randint(vocab, (global_batch, seq_len + 1), generator=generator)  # (b, s + 1)
    return tokens[:, :-1], tokens[:, 1:]


@dataclass(frozen=True)
class Options:
    """What a run adds to the plan: a token file to read (``data``, its ``data_dtype``), a Hugging Face
    checkpoint to start from (``init_from``), gradient clipping (``clip_grad``: the largest global norm)
    and ``torch.compile`` of each block (``compile``)."""

    data: str | None = None
    data_dtype: str | None = None
    init_from: str | None = None
    clip_grad: float | None = None
    compile: bool = False

    def check(self, plan: Plan, *, scan_data: bool = False, model: nn.Module | None = None) -> None:
        """Bad input, before any process group: a missing --data file (with ``scan_data``, also one too
        short or with an id outside the vocabulary: the whole file is read), a bad --clip-grad, a missing
        --init-from checkpoint, or (given the whole ``model``, e.g. built on meta) one whose names or
        shapes differ from the model's, --compile of a program torch cannot compile
        (``codegen.options.compile_refusal``) (each a ``PlanError``); and a plan dtype this machine cannot train in
        (``codegen.precision.check_runnable``)."""
        check_device_dtype(plan.dtype)
        if self.compile and (refusal := compile_refusal(lower(plan))) is not None:
            raise PlanError(refusal)
        if self.data is not None:
            file = TokenFile.open(self.data, int(plan.model["vocab"]), self.data_dtype)
            if scan_data:
                file.check(plan.global_batch, plan.seq_len)
        if self.clip_grad is not None:
            check_max_norm(self.clip_grad)
        if self.init_from is not None:
            from .pretrained import check_pretrained, find_safetensors

            find_safetensors(self.init_from)
            if model is not None:
                check_pretrained(model, self.init_from)


def check_device_dtype(dtype: str) -> None:
    """``plan.dtype`` runs on the device the ranks here will use (``distributed.device_for_rank``: a GPU
    when CUDA is available, else the CPU)."""
    cuda = torch.cuda.is_available()
    check_runnable(dtype, "cuda" if cuda else "cpu", bf16_supported=not cuda or torch.cuda.is_bf16_supported())


def prepare_model(plan: Plan, model: nn.Module, options: Options) -> nn.Module:
    """Before sharding: compile each block if asked."""
    if options.compile:
        compile_blocks(model, structure_of(plan).blocks)
    return model


def prepare(pm: PlannedModule, options: Options) -> TokenStream | None:
    """After sharding, before any step (collectives): load the pretrained weights, install clipping,
    open and check the token file; returns the data stream (None: synthetic tokens)."""
    if options.init_from is not None:
        pm.load_pretrained(options.init_from)
    if options.clip_grad is not None:
        install_clipping(pm, options.clip_grad)
    return open_stream(options.data, pm, dtype=options.data_dtype) if options.data is not None else None


def plan_pg_timeout_s(plan: Plan, override_s: float | None = None) -> float:
    """The process group's timeout for ``plan``: ``distributed.pg_timeout_s`` of its predicted step."""
    return timeout_for_step(plan.prediction.step_time_s if plan.prediction is not None else 0.0, override_s)


def run_training(plan: Plan, model: nn.Module, steps: int = 5, seed: int = 0, *,
                 optimizer: OptimizerFactory | None = None, fuse: bool = False,
                 pg_timeout_s: float | None = None, options: Options = Options()) -> list[float]:
    """Shard ``model`` (built after ``torch.manual_seed(seed)``) and train ``steps`` steps; rank 0 prints
    ``step N loss X`` and the median step time after the first step. Returns the losses (every rank).
    ``pg_timeout_s`` overrides how long a collective waits for a stopped rank (``plan_pg_timeout_s``);
    ``options``: data file, pretrained weights, clipping, compile."""
    options.check(plan)
    # entry points call it before they build (meshplan run's worker, main below); this covers a caller's
    # own model for the steps, though a heap its build already grew keeps serving from resident pages
    return_freed_memory()
    created = init_distributed(plan_pg_timeout_s(plan, pg_timeout_s))
    try:
        pm = apply(plan, prepare_model(plan, model, options), optimizer=optimizer, fuse=fuse)
        data = prepare(pm, options)
        losses = train_steps(pm, plan, range(1, steps + 1), seed, data=data)
    except BaseException:
        close_distributed(created, ok=False)
        raise
    close_distributed(created, ok=True)
    return losses


def train_steps(pm: PlannedModule, plan: Plan, steps: range, seed: int, *,
                before: Callable[[int], None] | None = None, after: Callable[[int], None] | None = None,
                data: TokenStream | None = None) -> list[float]:
    """Train ``steps`` on the synthetic stream, or on ``data`` (this rank's rows, from its position on);
    rank 0 prints each loss and the median step time after the first. ``before(step)`` and
    ``after(step)`` run around each step (fault injection, checkpoints)."""
    losses, times = [], []
    rank0 = dist.get_rank() == 0
    for step in steps:
        if before is not None:
            before(step)
        start = time.perf_counter()
        if data is None:
            inputs, targets = synthetic_batch(plan.model["vocab"], plan.global_batch, plan.seq_len, seed, step)
            losses.append(pm.step(inputs, targets))
        else:  # this dp rank's rows; under context parallelism, its tokens of each
            inputs, targets = data.next_batch()
            losses.append(pm.step(pm.sequence.take(inputs), pm.sequence.take(targets), local=True))
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


def add_option_args(parser: argparse.ArgumentParser) -> None:
    """``Options``' flags (``meshplan run`` and ``python -m meshplan.runtime.train``)."""
    parser.add_argument("--data", metavar="FILE", help="train on this flat token file (nanoGPT's train.bin, a "
                        "Megatron .bin), memory-mapped; default: synthetic tokens")
    parser.add_argument("--data-dtype", choices=("uint16", "uint32", "int32"),
                        help="the token file's integer type (default: from a Megatron .idx beside it, else "
                             "uint16 if the vocabulary fits, else uint32)")
    parser.add_argument("--init-from", metavar="DIR", help="start from this Hugging Face safetensors checkpoint "
                        "(model.save_pretrained's directory); each rank reads only what it holds")
    parser.add_argument("--clip-grad", type=float, metavar="NORM",
                        help="clip gradients to this global 2-norm (over every mesh axis) before each step")
    parser.add_argument("--compile", action="store_true", help="torch.compile each block before sharding")


def options_of(args: argparse.Namespace) -> Options:
    return Options(data=args.data, data_dtype=args.data_dtype, init_from=args.init_from,
                   clip_grad=args.clip_grad, compile=args.compile)


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
    add_option_args(parser)
    args = parser.parse_args(argv)
    plan = Plan.load(args.plan)
    builder = model_builder or load_builder(args.builder)
    return_freed_memory()  # before the build, or its freed tensors grow the heap that every later one reuses
    torch.manual_seed(args.seed)  # every rank builds the same initial weights
    run_training(plan, builder(plan.model), steps=args.steps, seed=args.seed, fuse=args.fuse,
                 pg_timeout_s=args.pg_timeout, options=options_of(args))
    return 0


if __name__ == "__main__":
    code = main()
    # a torchrun worker: leave without the interpreter's teardown, where a gloo group's threads can
    # still abort the process after all the work is done ("terminate called without an active exception")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
