"""Mixed precision from ``plan.dtype``: which steps cast what.

FSDP2 programs cast in ``fully_shard`` (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``:
bf16 all-gathered parameters, fp32 reduce-scatter, fp32 sharded parameters as master weights). Every
bf16 program also has an ``Autocast`` step on the root (on each pipeline stage), before DDP or FSDP2
wraps it: without FSDP2 (DDP, tensor parallelism alone, pipeline stages without dp) it is what runs
the matmuls in bf16 on fp32 parameters, whose gradients (and DDP's all-reduce) stay fp32; with FSDP2
it runs the ops that mix dtypes (fp32 rotary tables and norms on bf16 activations) in one dtype, as
mixed-precision training needs. fp32 plans get neither.

``check_runnable`` refuses, before any process starts, a dtype the program or the device cannot train
in: float8 (the cost model prices it; training it needs float8 linears such as torchao's
``Float8Linear`` with scaled matmuls, which the runtime does not install), and bfloat16 on a CUDA GPU
without bf16 arithmetic (before Ampere: ``torch.cuda.is_bf16_supported()`` is false). CPUs run
bfloat16 and float16 under ``torch.autocast("cpu")``, and gloo all-gathers both.
"""
from __future__ import annotations

import dataclasses

from ..ir import InvalidPlanError
from .program import MIXED_DTYPES, Autocast, DataParallel, FullyShard, Step

REDUCE_DTYPE = "float32"  # gradients are reduced in fp32 under every compute dtype


def check_runnable(dtype: str, device_type: str | None = None, *, bf16_supported: bool = True) -> None:
    """Raise ``InvalidPlanError`` if a program cannot train in ``dtype`` (on ``device_type``, "cpu" or
    "cuda", when given; ``bf16_supported``: the GPU's ``torch.cuda.is_bf16_supported()``)."""
    if dtype not in MIXED_DTYPES:
        raise InvalidPlanError(f"the plan trains in {dtype}, but meshplan's runtime trains only in {', '.join(MIXED_DTYPES)} "
                               f"({dtype} needs scaled low-precision linears it does not install); plan again with "
                               "--dtype bfloat16")
    if dtype == "bfloat16" and device_type == "cuda" and not bf16_supported:
        raise InvalidPlanError("the plan trains in bfloat16, but this GPU has no bf16 arithmetic (before Ampere); plan "
                               "again with --dtype float32, or run on an A100, H100 or newer")


def with_precision(dtype: str, steps: list[Step]) -> list[Step]:
    """``steps`` computing in ``dtype``: an Autocast step on the root before any data-parallel wrapper
    (DDP and FSDP2 call the autocast forward), and FullyShard steps with FSDP2's policy."""
    check_runnable(dtype)
    if dtype == "float32":
        return steps
    steps = [dataclasses.replace(s, param_dtype=dtype, reduce_dtype=REDUCE_DTYPE) if isinstance(s, FullyShard)
             else s for s in steps]
    at = next((i for i, s in enumerate(steps) if isinstance(s, (DataParallel, FullyShard))), len(steps))
    return [*steps[:at], Autocast(module="", dtype=dtype), *steps[at:]]
