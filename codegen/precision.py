"""Mixed precision from ``plan.dtype``: which steps cast what.

FSDP2 programs cast in ``fully_shard`` (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``:
bf16 all-gathered parameters, fp32 reduce-scatter, fp32 sharded parameters as master weights). Every
bf16 program also has an ``Autocast`` step on the root (on each pipeline stage), before DDP or FSDP2
wraps it: without FSDP2 (DDP, tensor parallelism alone, pipeline stages without dp) it is what runs
the matmuls in bf16 on fp32 parameters, whose gradients (and DDP's all-reduce) stay fp32; with FSDP2
it runs the ops that mix dtypes (fp32 rotary tables and norms on bf16 activations) in one dtype, as
mixed-precision training needs. fp32 plans get neither.
"""
from __future__ import annotations

import dataclasses

from .program import Autocast, DataParallel, FullyShard, Step

REDUCE_DTYPE = "float32"  # gradients are reduced in fp32 under every compute dtype


def with_precision(dtype: str, steps: list[Step]) -> list[Step]:
    """``steps`` computing in ``dtype``: an Autocast step on the root before any data-parallel wrapper
    (DDP and FSDP2 call the autocast forward), and FullyShard steps with FSDP2's policy."""
    if dtype == "float32":
        return steps
    steps = [dataclasses.replace(s, param_dtype=dtype, reduce_dtype=REDUCE_DTYPE) if isinstance(s, FullyShard)
             else s for s in steps]
    at = next((i for i, s in enumerate(steps) if isinstance(s, (DataParallel, FullyShard))), len(steps))
    return [*steps[:at], Autocast(module="", dtype=dtype), *steps[at:]]
