"""The cost model's memory prediction against what the runtime really holds: a small GPT under many
plans on 4 gloo processes, in fp32 and in bf16 mixed precision.

    python bench/cpu_memory.py [--nproc 4] [--dtypes float32,bfloat16]

Every plan is built as ``meshplan run`` builds it (on meta, ``runtime.materialize.build_on_meta``, each
rank materializing only its shards), applied with the real runtime (``runtime.apply``), stepped once (the
optimizer makes its state lazily), then stepped again, all under one memory profile
(``runtime.memory.measure_plan_memory``): the bytes live when the measured step starts (resident:
weights, gradients, optimizer state, DDP buckets, FSDP buffers) and the most live during it. The most loaded rank is compared with ``cost_model.estimate``'s
``peak_memory_bytes`` on ``cpu:1x<nproc>`` (``footprint.peak_memory``, what ``estimate`` reports: the
CPU preset lists no bf16 FLOP/s, and memory needs none): the prediction must never be the smaller (an
under-estimate is an out-of-memory risk on a real cluster). Memory does not depend on load, so
unlike the time benchmark this one is not disturbed by other work on the machine.

A benchmark, not a test: it prints and asserts nothing (tests/runtime/test_runtime_memory.py
asserts the same check on a few plans).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
import warnings
from pathlib import Path

from cpu_plans import MODEL, build_plans, run_workers

def _worker(rank: int, world: int, port: int, plans_json: str, output: str, errors: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    from meshplan import ir
    from meshplan.codegen.lower import lower
    from meshplan.runtime import apply, init_distributed
    from meshplan.runtime.materialize import build_on_meta
    from meshplan.runtime.memory import measure_plan_memory
    from meshplan.runtime.train import synthetic_batch

    try:
        init_distributed()
        results = {}
        for label, data in json.loads(plans_json):
            plan = ir.Plan.from_dict(data)
            try:
                lower(plan)
            except ir.PlanError as exc:
                results[label] = {"skipped": str(exc)}
                continue
            def setup(plan=plan):
                pm = apply(plan, build_on_meta({"kind": "zoo", "config": plan.model}, seed=0))
                pm.step(*synthetic_batch(plan.model["vocab"], plan.global_batch, plan.seq_len, 0, 0))
                return pm

            def step(pm, plan=plan):
                pm.step(*synthetic_batch(plan.model["vocab"], plan.global_batch, plan.seq_len, 0, 1))

            mine = measure_plan_memory(setup, step)
            gathered: list[dict] = [{}] * world
            dist.all_gather_object(gathered, mine)
            results[label] = max(gathered, key=lambda m: m["peak"])
        if rank == 0:
            Path(output).write_text(json.dumps(results))
        dist.destroy_process_group()
    except Exception:
        Path(errors, f"rank{rank}.txt").write_text(traceback.format_exc())
        raise


def measure(plans: list[tuple[str, object]], nproc: int) -> dict:
    """label -> the most loaded rank's {"resident", "in_step", "peak"} bytes, or {"skipped"}."""
    return run_workers(_worker, nproc, plans)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated plan dtypes to run each plan in")
    args = ap.parse_args(argv)
    from meshplan import zoo
    from meshplan.cost_model.footprint import peak_memory
    from meshplan.cost_model.pipeline import rank_layers
    from meshplan.cost_model.summary import summary_of
    from meshplan.frontend import trace

    if args.nproc != 4:
        raise SystemExit("the plans here are for 4 processes; run with --nproc 4")
    dtypes = args.dtypes.split(",")
    if not set(dtypes) <= {"float32", "bfloat16"}:
        raise SystemExit(f"--dtypes takes float32 and bfloat16, got {args.dtypes!r}")
    plans = [(label + ("" if dtype == "float32" else f", {dtype}"), dataclasses.replace(plan, dtype=dtype))
             for dtype in dtypes for label, plan in build_plans(f"cpu:1x{args.nproc}")]
    measured = measure(plans, args.nproc)
    summary = summary_of(trace(zoo.build_from_config(MODEL), batch=1, seq_len=64))  # shapes symbolic in b, s
    mb = 1e6
    print(f"{'plan':<38} {'resident':>9} {'in step':>8} {'measured':>9} {'predicted':>9} "
          f"{'pred state':>10} {'pred act+buf':>12} {'ratio':>6}")
    ratios, under = [], []
    for label, plan in plans:
        got = measured[label]
        if "skipped" in got:
            print(f"{label:<38} skipped: {got['skipped']}")
            continue
        parts = peak_memory(summary, plan, rank_layers(plan, MODEL["layers"]))
        state = parts["params"] + parts["grads"] + parts["optimizer"]
        predicted = sum(parts.values())
        ratio = predicted / got["peak"]
        ratios.append(ratio)
        if ratio < 1.0:
            under.append(label)
        print(f"{label:<38} {got['resident'] / mb:9.2f} {got['in_step'] / mb:8.2f} {got['peak'] / mb:9.2f} "
              f"{predicted / mb:9.2f} {state / mb:10.2f} {(predicted - state) / mb:12.2f} "
              f"{ratio:6.2f}{'  UNDER' if ratio < 1.0 else ''}")
    wide = sum(r > 1.25 for r in ratios)
    print(f"\nMB per rank (the most loaded); ratio = predicted / measured over {len(ratios)} plans: "
          f"min {min(ratios):.2f}, max {max(ratios):.2f}; under-estimates: {len(under)}"
          + (f" ({', '.join(under)})" if under else "") + f"; over by more than 25%: {wide}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
