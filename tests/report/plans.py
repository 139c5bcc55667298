"""The plans the report and export tests look at, planned once per test session (planning takes
seconds to a minute on a loaded machine): a pp x dp x tp plan with an interleaved schedule, an MoE
plan from the zoo (expert parallel, mixed recomputation), a ZeRO-3 data-parallel plan, and a pp x dp
plan with ZeRO-0 and 1F1B that DeepSpeed's pipeline engine can run."""
from __future__ import annotations

from functools import lru_cache

SPECS = {
    "dense": ("llama3-8b", {"pp": 2, "dp": 4, "tp": 8, "vp": 2, "schedule": "interleaved-1f1b", "zero": 2}),
    # ZeRO-2 pinned: the exporters' test reads this plan, and Megatron runs no ZeRO-3 (FSDP2) with experts;
    # full recompute pinned: Megatron's --recompute-granularity is one value, and the planner mixes selective
    # and full layers where memory allows
    "moe": ("mixtral-8x7b", {"ep": 8, "zero": 2, "recompute": "full"}),
    # sharded over all of dp: Megatron's distributed optimizer and DeepSpeed run no HSDP groups under ZeRO-3
    "zero3": ("llama3-8b", {"pp": 1, "tp": 1, "zero": 3, "zero_group": 0}),
    "pipeline-ddp": ("gpt3-1.3b", {"pp": 2, "tp": 1, "zero": 0, "schedule": "1f1b"}),
}


@lru_cache(maxsize=None)
def plan(kind: str):
    import meshplan as mp

    model, fixed = SPECS[kind]
    return mp.autoparallelize(model, "h100-sxm:8x8", global_batch=256, seq_len=2048, fixed=dict(fixed),
                              time_limit_s=60)


if __name__ == "__main__":
    import sys

    for kind in SPECS:
        p = plan(kind)
        p.save(f"{sys.argv[1]}/{kind}.json")
        print(kind, p.summary())
