"""The torchtitan software preset (meshplan's runtime's stack: FSDP2, DTensor TP, with torchtitan's op-level
selective recompute) against torchtitan's published FSDP2 and FSDP2 + TP measurements on A100 and H100.

    python bench/pytorch_native_runs.py

Each row of ``bench/data/torchtitan_runs.csv`` (with its source file and commit) becomes a Llama graph
(the cost model reads its dimensions and parameter total), the plan torchtitan ran (FSDP over dp =
ZeRO-3, TP, the local batch as one micro-batch, its activation checkpointing: "full", "selective op" as
selective (which the preset prices as torchtitan's policy: ``Software.selective_alternate_matmuls``),
"selective layer" as every second block full), and is estimated with ``software="torchtitan"`` in bf16
(``+fused-norm`` where its config used torchtitan's fused RMSNorm, the ``norm_type`` column). Printed per
row: tokens/s per GPU measured and predicted, the error (predicted / measured - 1: positive is optimistic),
and where the source gives it, the memory per GPU (torchtitan's max reserved) beside the predicted peak.
Rows that ran torch.compile or torchao's Float8 are estimated as ``torchtitan+compile`` and ``+float8`` (a float8
plan), Table 2's context-parallel rows with their ``cp`` column; the row that ran asynchronous TP is listed as not
modeled (the cost model does not price it). The H100
rows ran on Grand Teton's 96 GB HBM2e H100 at a 500 W cap: their cluster file
(``bench/data/clusters/grand-teton-h100-96gb.json``) has the memory, its 2.4 TB/s and the network their
source states, and the middle of the peak-rate interval it states (between the H100 SXM's and the H100 NVL's:
no rate at 500 W is published), with the 700 W SXM's measured fraction of its peak.

The same rows are a source of ``bench/reference_runs.py``'s in-sample and leave-one-source-out tables
(``reference_runs.torchtitan_plan`` builds each row's plan for both benches).

A benchmark, not a test: it prints and asserts nothing. Nothing in the cost model was fitted to
these rows.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from meshplan.cost_model import estimate, software_named

from reference_runs import TORCHTITAN_CSV as DATA, graph_of, torchtitan_plan, torchtitan_software  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=DATA)
    args = ap.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    print(f"{'run':44s} {'GPUs':>5s} {'AC':>15s} {'tok/s/GPU':>10s} {'predicted':>10s} {'error':>7s}"
          f" {'mem GiB':>8s} {'predicted':>9s}")
    errors, skipped = [], []
    for row in rows:
        built = torchtitan_plan(row)
        cp = f" cp{row['cp']}" if (row.get("cp") or "1").strip() not in ("", "1") else ""
        label = (f"{row['model']} {row['gpu_type'][:4]} dp{row['dp']} tp{row['tp']}{cp} lb{row['local_batch']} "
                 f"{row['extras']}").strip()
        if isinstance(built, str):
            skipped.append(f"{label}: {built}")
            continue
        plan, cluster, cfg = built
        pred = estimate(graph_of(cfg), cluster, plan, software=software_named(torchtitan_software(row)))
        tps = plan.global_batch * plan.seq_len / pred.step_time_s / plan.world_size
        measured = float(row["measured_tokens_per_s_per_gpu"])
        err = tps / measured - 1
        errors.append(abs(err))
        mem = row["measured_memory_gib"].strip()
        mem_text = f"{float(mem):8.1f} {pred.peak_memory_bytes / 2**30:9.1f}" if mem else \
            f"{'-':>8s} {pred.peak_memory_bytes / 2**30:9.1f}"
        print(f"{label:44s} {plan.world_size:5d} {row['activation_checkpointing']:>15s} {measured:10,.0f} "
              f"{tps:10,.0f} {err:+7.1%} {mem_text}")
    if errors:
        print(f"\nmean absolute throughput error over {len(errors)} rows: {sum(errors) / len(errors):.1%}")
    for line in skipped:
        print(f"not modeled: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
